//! Workflow run records: every case runs against SQLite and PostgreSQL.

mod cases {
    use std::time::Duration;

    use sessionstore::testing::TestStore;
    use sessionstore::*;

    const PROGRAM: &str = "# a comment kept verbatim\nsteps:\n  - name: one\n    sleep: 1s\n";

    fn tenant(t: &str) -> TenantId {
        TenantId::new(t).unwrap()
    }

    fn new_run(id: &str, key: Option<&str>) -> NewRun {
        NewRun {
            run_id: RunId::new(id).unwrap(),
            tenant: tenant("acme"),
            source: PROGRAM.into(),
            input: r#"{"n":1}"#.into(),
            holder: "host-a/attempt-1".into(),
            fencing_token: format!("token-{id}-1"),
            lease: Duration::from_secs(60),
            idempotency_key: key.map(str::to_owned),
            pins: Vec::new(),
            started_by: Some("user:ann".into()),
            trace: None,
        }
    }

    fn pin(identity: &str, digit: char) -> RunPin {
        RunPin {
            identity: identity.into(),
            digest: format!("sha256:{}", digit.to_string().repeat(64)),
        }
    }

    fn result(step: &str, body: &str) -> NewStepEntry {
        NewStepEntry {
            step: step.into(),
            kind: StepEntryKind::Result,
            attempt: 0,
            outcome: Some("succeeded".into()),
            body: body.into(),
            started_at_ms: None,
            consumes: None,
        }
    }

    fn ask(name: &str) -> NewCheckpoint {
        NewCheckpoint {
            name: name.into(),
            kind: CheckpointKind::Ask,
            question: Some("ship it?".into()),
            schema: Some(r#"{"type":"boolean"}"#.into()),
            sleep: None,
        }
    }

    /// Host B takes over `s` (epoch 1, held by host A) under token `token-b`.
    async fn taken_by_host_b(ts: &TestStore, s: &RunStatus) -> RunStatus {
        ts.store
            .take_run(Takeover {
                run_id: s.run_id.clone(),
                expected_epoch: 1,
                holder: "host-b/attempt-1".into(),
                fencing_token: "token-b".into(),
                lease: Duration::from_secs(60),
                rule: TakeoverRule::HeldByOrExpired("host-a/".into()),
            })
            .await
            .unwrap()
    }

    async fn start(ts: &TestStore, id: &str) -> RunStatus {
        ts.store.create_run(new_run(id, None)).await.unwrap().status
    }

    pub async fn a_run_is_recorded_with_its_exact_program_and_a_first_status_at_epoch_one(
        ts: &TestStore,
    ) {
        let created = ts.store.create_run(new_run("run-1", None)).await.unwrap();
        assert!(created.created);
        let s = created.status;
        assert_eq!(
            (s.state, s.epoch, s.holder.as_str()),
            (RunState::Running, 1, "host-a/attempt-1")
        );
        assert_eq!(s.input, r#"{"n":1}"#);
        let program = ts.store.run_program(&s.run_id).await.unwrap().unwrap();
        assert_eq!(program.source, PROGRAM);
        assert_eq!(program.sha256, sessionstore::sha256_hex(PROGRAM.as_bytes()));
        let mut second = new_run("run-1", None);
        second.source = "steps: []\n".into();
        let err = ts.store.create_run(second).await.unwrap_err();
        assert_eq!(err.code(), ErrorCode::Conflict, "{err}");
        let program = ts.store.run_program(&s.run_id).await.unwrap().unwrap();
        assert_eq!(program.source, PROGRAM, "the first program stands");
    }

    pub async fn a_start_retried_with_its_idempotency_key_returns_the_first_run(ts: &TestStore) {
        let first = ts
            .store
            .create_run(new_run("run-1", Some("key-1")))
            .await
            .unwrap();
        let again = ts
            .store
            .create_run(new_run("run-2", Some("key-1")))
            .await
            .unwrap();
        assert!(first.created);
        assert!(!again.created);
        assert_eq!(again.status.run_id, first.status.run_id);
        assert!(
            ts.store
                .run_status(None, &RunId::new("run-2").unwrap())
                .await
                .unwrap()
                .is_none()
        );
        assert_eq!(ts.store.runs(&tenant("acme")).await.unwrap().len(), 1);
    }

    pub async fn a_tenants_runs_mark_moves_with_each_status_change_and_only_its_own(
        ts: &TestStore,
    ) {
        let acme = tenant("acme");
        let mark = |t: TenantId| async move { ts.store.runs_mark(&t).await.unwrap() };
        assert_eq!(mark(acme.clone()).await, RunsMark::default());
        let s = start(ts, "run-1").await;
        let started = mark(acme.clone()).await;
        assert_eq!(started.runs, 1);
        let fence = s.fence();
        ts.store
            .append_run_step(&fence, result("one", "1"))
            .await
            .unwrap();
        let stepped = mark(acme.clone()).await;
        assert_eq!(stepped.runs, 1);
        assert!(
            stepped.revisions > started.revisions,
            "{stepped:?} {started:?}"
        );
        // A renewal changes nothing a view shows, and so not the mark.
        ts.store
            .renew_run(&fence, std::time::Duration::from_secs(60))
            .await
            .unwrap();
        assert_eq!(mark(acme.clone()).await, stepped);
        // Another tenant's run moves its own mark, not this one's.
        let mut theirs = new_run("run-2", None);
        theirs.tenant = tenant("globex");
        ts.store.create_run(theirs).await.unwrap();
        assert_eq!(mark(acme.clone()).await, stepped);
        assert_eq!(mark(tenant("globex")).await.runs, 1);
        ts.store.end_run(&fence, RunEnd::Completed).await.unwrap();
        assert!(mark(acme).await.revisions > stepped.revisions);
    }

    pub async fn a_tenants_runs_are_read_in_pages_either_way_and_a_foreign_cursor_is_not_found(
        ts: &TestStore,
    ) {
        let acme = tenant("acme");
        for n in 1..=5 {
            start(ts, &format!("run-{n}")).await;
        }
        let mut theirs = new_run("run-0", None);
        theirs.tenant = tenant("globex");
        ts.store.create_run(theirs).await.unwrap();
        let pages = |order: RunOrder| {
            let acme = acme.clone();
            async move {
                let mut pages: Vec<Vec<String>> = Vec::new();
                let mut after: Option<RunId> = None;
                loop {
                    let page = ts
                        .store
                        .runs_page(std::slice::from_ref(&acme), after.as_ref(), 2, order)
                        .await
                        .unwrap();
                    pages.push(page.runs.iter().map(|r| r.run_id.to_string()).collect());
                    match page.next {
                        Some(next) => after = Some(next),
                        None => break,
                    }
                }
                pages
            }
        };
        assert_eq!(
            pages(RunOrder::OldestFirst).await,
            [
                vec!["run-1", "run-2"],
                vec!["run-3", "run-4"],
                vec!["run-5"]
            ]
        );
        assert_eq!(
            pages(RunOrder::NewestFirst).await,
            [
                vec!["run-5", "run-4"],
                vec!["run-3", "run-2"],
                vec!["run-1"]
            ]
        );
        // A page that holds the last run says no more follow.
        let whole = ts
            .store
            .runs_page(std::slice::from_ref(&acme), None, 5, RunOrder::OldestFirst)
            .await
            .unwrap();
        assert_eq!((whole.runs.len(), whole.next), (5, None));
        // Several tenants page together by creation; a run id names one run across them.
        let both = [acme.clone(), tenant("globex")];
        let mut seen = std::collections::BTreeSet::new();
        let mut after: Option<RunId> = None;
        loop {
            let page = ts
                .store
                .runs_page(&both, after.as_ref(), 4, RunOrder::NewestFirst)
                .await
                .unwrap();
            for r in page.runs {
                assert!(seen.insert(r.run_id.to_string()), "{} twice", r.run_id);
            }
            match page.next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        assert_eq!(seen.len(), 6, "{seen:?}");
        // A cursor must be one of the tenant's own runs: another tenant's reads as unknown.
        for cursor in ["run-0", "run-9"] {
            let e = ts
                .store
                .runs_page(
                    std::slice::from_ref(&acme),
                    Some(&RunId::new(cursor).unwrap()),
                    2,
                    RunOrder::OldestFirst,
                )
                .await
                .unwrap_err();
            assert_eq!(e.code(), ErrorCode::NotFound, "{e}");
        }
    }

    pub async fn another_tenants_run_reads_exactly_like_an_unknown_one(ts: &TestStore) {
        let s = start(ts, "run-1").await;
        let other = tenant("globex");
        assert!(
            ts.store
                .run_status(Some(&other), &s.run_id)
                .await
                .unwrap()
                .is_none()
        );
        assert!(ts.store.runs(&other).await.unwrap().is_empty());
        let fence = s.fence();
        ts.store
            .arm_run_checkpoint(&fence, ask("approve"))
            .await
            .unwrap();
        let theirs = ts
            .store
            .answer_run(&other, &s.run_id, "approve", "true", "globex")
            .await
            .unwrap_err();
        let unknown = ts
            .store
            .answer_run(
                &other,
                &RunId::new("nosuch").unwrap(),
                "approve",
                "true",
                "globex",
            )
            .await
            .unwrap_err();
        assert_eq!(theirs.code(), ErrorCode::NotFound);
        assert_eq!(unknown.code(), ErrorCode::NotFound);
        let err = ts.store.cancel_run(&other, &s.run_id).await.unwrap_err();
        assert_eq!(err.code(), ErrorCode::NotFound);
        assert!(ts.store.run_answers(&s.run_id).await.unwrap().is_empty());
    }

    pub async fn a_step_has_at_most_one_result(ts: &TestStore) {
        let s = start(ts, "run-1").await;
        let fence = s.fence();
        let e = ts
            .store
            .append_run_step(&fence, result("one", "1"))
            .await
            .unwrap();
        assert_eq!((e.seq, e.epoch, e.body.as_str()), (1, 1, "1"));
        let err = ts
            .store
            .append_run_step(&fence, result("one", "2"))
            .await
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::Conflict, "{err}");
        let journal = ts.store.run_journal(&s.run_id).await.unwrap();
        assert_eq!(journal.len(), 1);
        assert_eq!(journal[0].body, "1");
        let status = ts.store.run_status(None, &s.run_id).await.unwrap().unwrap();
        assert_eq!(status.step.as_deref(), Some("one"));
    }

    pub async fn after_a_takeover_every_write_under_the_old_fence_is_refused(ts: &TestStore) {
        let s = start(ts, "run-1").await;
        let old = s.fence();
        let taken = taken_by_host_b(ts, &s).await;
        assert_eq!(
            (taken.epoch, taken.holder.as_str()),
            (2, "host-b/attempt-1")
        );
        assert_ne!(taken.fencing_token, s.fencing_token);
        let refusals = [
            ts.store
                .append_run_step(&old, result("one", "1"))
                .await
                .unwrap_err(),
            ts.store
                .arm_run_checkpoint(&old, ask("approve"))
                .await
                .unwrap_err(),
            ts.store.end_run(&old, RunEnd::Completed).await.unwrap_err(),
            ts.store
                .renew_run(&old, Duration::from_secs(60))
                .await
                .unwrap_err(),
        ];
        for err in refusals {
            assert_eq!(err.code(), ErrorCode::ClaimLost, "{err}");
        }
        assert!(ts.store.run_journal(&s.run_id).await.unwrap().is_empty());
        ts.store
            .append_run_step(&taken.fence(), result("one", "1"))
            .await
            .unwrap();
        let now = ts.store.run_status(None, &s.run_id).await.unwrap().unwrap();
        assert_eq!(now.state, RunState::Running);
        assert_eq!(now.epoch, 2);
    }

    pub async fn a_takeover_needs_the_read_epoch_and_an_expired_lease_of_another_holder(
        ts: &TestStore,
    ) {
        let mut r = new_run("run-1", None);
        r.lease = Duration::from_millis(300);
        let s = ts.store.create_run(r).await.unwrap().status;
        let take = |holder: &str, epoch: u64| Takeover {
            run_id: s.run_id.clone(),
            expected_epoch: epoch,
            holder: holder.into(),
            fencing_token: format!("tok-{holder}"),
            lease: Duration::from_secs(60),
            rule: TakeoverRule::LeaseExpired,
        };
        let early = ts.store.take_run(take("host-b/1", 1)).await.unwrap_err();
        assert_eq!(early.code(), ErrorCode::ClaimHeld, "{early}");
        ts.advance(Duration::from_millis(600)).await;
        let stale = ts.store.take_run(take("host-b/1", 7)).await.unwrap_err();
        assert_eq!(stale.code(), ErrorCode::Conflict, "{stale}");
        let (a, b) = tokio::join!(
            ts.store.take_run(take("host-b/1", 1)),
            ts.store.take_run(take("host-c/1", 1))
        );
        assert!(
            a.is_ok() != b.is_ok(),
            "exactly one takeover wins: {a:?} {b:?}"
        );
        let loser = a.err().or(b.err()).unwrap();
        assert_eq!(loser.code(), ErrorCode::Conflict, "{loser}");
        let now = ts.store.run_status(None, &s.run_id).await.unwrap().unwrap();
        assert_eq!(now.epoch, 2);
    }

    pub async fn a_run_is_free_once_its_hosts_registration_expires_even_under_a_live_lease(
        ts: &TestStore,
    ) {
        let advertise = |host: &str| HostAdvertisement {
            host: HostId::new(host).unwrap(),
            endpoint: format!("ws://{host}:7400"),
            placement: Placement::Pooled,
            isolation_class: "shared".into(),
            capacity: 8,
            accepting: true,
            generation: 1,
            ttl: Duration::from_millis(500),
        };
        ts.store.advertise(advertise("host-a")).await.unwrap();
        let s = start(ts, "run-1").await; // held by host-a, lease 60 s
        let take = |holder: &str| Takeover {
            run_id: s.run_id.clone(),
            expected_epoch: 1,
            holder: holder.into(),
            fencing_token: format!("tok-{holder}"),
            lease: Duration::from_secs(60),
            rule: TakeoverRule::LeaseExpired,
        };
        let live = ts.store.take_run(take("host-b/1")).await.unwrap_err();
        assert_eq!(
            live.code(),
            ErrorCode::ClaimHeld,
            "a live Host keeps its run: {live}"
        );
        ts.advance(Duration::from_millis(800)).await;
        let taken = ts.store.take_run(take("host-b/1")).await.unwrap();
        assert_eq!((taken.epoch, taken.holder.as_str()), (2, "host-b/1"));
        // A holder whose Host never registered is judged by its lease alone.
        let mut t = take("host-c/1");
        let mut unregistered = new_run("run-3", None);
        unregistered.holder = "host-z/attempt-1".into();
        let z = ts.store.create_run(unregistered).await.unwrap().status;
        t.run_id = z.run_id.clone();
        let held = ts.store.take_run(t).await.unwrap_err();
        assert_eq!(held.code(), ErrorCode::ClaimHeld, "{held}");
        assert_eq!(holder_host("host-a/attempt-1"), "host-a");
        assert_eq!(holder_host("bare"), "bare");
    }

    fn ids(runs: &[RunStatus]) -> Vec<&str> {
        runs.iter().map(|r| r.run_id.as_str()).collect()
    }

    pub async fn a_parked_run_names_no_holder_and_takes_no_write_under_its_fence(ts: &TestStore) {
        let s = start(ts, "run-1").await;
        let f = s.fence();
        ts.store
            .arm_run_checkpoint(&f, ask("approve"))
            .await
            .unwrap();
        let parked = ts
            .store
            .park_run(&f, ParkUntil::Answered("approve".into()))
            .await
            .unwrap();
        assert!(parked);
        let now = ts.store.run_status(None, &s.run_id).await.unwrap().unwrap();
        assert!(now.is_parked(), "{now:?}");
        assert_eq!((now.epoch, now.holder.as_str()), (1, PARKED_HOLDER));
        // No writer holds a parked run: a renewal in flight, or a late write, is refused.
        let renewal = ts
            .store
            .renew_run(&f, Duration::from_secs(60))
            .await
            .unwrap_err();
        assert_eq!(renewal.code(), ErrorCode::ClaimLost, "{renewal}");
        let write = ts
            .store
            .append_run_step(&f, result("approve", "{}"))
            .await
            .unwrap_err();
        assert_eq!(write.code(), ErrorCode::ClaimLost, "{write}");
        let again = ts.store.run_status(None, &s.run_id).await.unwrap().unwrap();
        assert_eq!(again.lease_expires_at_ms, now.lease_expires_at_ms);
        // A booting Host's own-runs rule does not reach it: it belongs to no Host.
        let host = HostId::new("host-a").unwrap();
        let due = ts
            .store
            .runs_to_take(ts.store.now_ms().await.unwrap(), &[host], 100)
            .await
            .unwrap();
        assert!(due.is_empty(), "{due:?}");
    }

    pub async fn parking_at_an_answered_ask_writes_nothing_and_says_so(ts: &TestStore) {
        let s = start(ts, "run-1").await;
        let f = s.fence();
        ts.store
            .arm_run_checkpoint(&f, ask("approve"))
            .await
            .unwrap();
        ts.store
            .answer_run(&tenant("acme"), &s.run_id, "approve", "true", "acme")
            .await
            .unwrap();
        let before = ts.store.run_status(None, &s.run_id).await.unwrap().unwrap();
        let parked = ts
            .store
            .park_run(&f, ParkUntil::Answered("approve".into()))
            .await
            .unwrap();
        assert!(!parked, "the answer is there: the driver goes on");
        let after = ts.store.run_status(None, &s.run_id).await.unwrap().unwrap();
        assert_eq!(before, after);
    }

    pub async fn an_answer_or_a_deadline_makes_a_parked_run_due_for_any_host(ts: &TestStore) {
        let asked = start(ts, "run-ask").await;
        let f = asked.fence();
        ts.store
            .arm_run_checkpoint(&f, ask("approve"))
            .await
            .unwrap();
        ts.store
            .park_run(&f, ParkUntil::Answered("approve".into()))
            .await
            .unwrap();
        let napping = start(ts, "run-nap").await;
        let now = ts.store.now_ms().await.unwrap();
        ts.store
            .park_run(&napping.fence(), ParkUntil::Due(now + 500))
            .await
            .unwrap();
        let driven = start(ts, "run-driven").await;
        let due = |ts: &TestStore| {
            let store = ts.store.clone();
            async move {
                let now = store.now_ms().await.unwrap();
                store.runs_to_take(now, &[], 100).await.unwrap()
            }
        };
        assert!(due(ts).await.is_empty(), "nothing is due yet");
        ts.store
            .answer_run(&tenant("acme"), &asked.run_id, "approve", "true", "acme")
            .await
            .unwrap();
        assert_eq!(ids(&due(ts).await), ["run-ask"]);
        ts.advance(Duration::from_millis(600)).await;
        assert_eq!(ids(&due(ts).await), ["run-ask", "run-nap"]);
        let taken = ts
            .store
            .take_run(Takeover {
                run_id: asked.run_id.clone(),
                expected_epoch: 1,
                holder: "host-b/1".into(),
                fencing_token: "tok-b".into(),
                lease: Duration::from_secs(60),
                rule: TakeoverRule::LeaseExpired,
            })
            .await
            .unwrap();
        assert_eq!((taken.epoch, taken.holder.as_str()), (2, "host-b/1"));
        // A driven run is due once its Host is named (dead, or booting), or its lease ends.
        let now = ts.store.now_ms().await.unwrap();
        let named = ts
            .store
            .runs_to_take(now, &[HostId::new("host-a").unwrap()], 100)
            .await
            .unwrap();
        assert_eq!(ids(&named), ["run-nap", "run-driven"]);
        assert_eq!(driven.holder, "host-a/attempt-1");
    }

    pub async fn a_sleep_armed_again_keeps_its_first_deadline(ts: &TestStore) {
        let s = start(ts, "run-1").await;
        let nap = NewCheckpoint {
            name: "nap".into(),
            kind: CheckpointKind::Sleep,
            question: None,
            schema: None,
            sleep: Some(Duration::from_secs(60)),
        };
        let first = ts
            .store
            .arm_run_checkpoint(&s.fence(), nap.clone())
            .await
            .unwrap();
        let deadline = first.deadline_at_ms.unwrap();
        assert_eq!(deadline - first.armed_at_ms, 60_000);
        ts.advance(Duration::from_millis(200)).await;
        let again = ts.store.arm_run_checkpoint(&s.fence(), nap).await.unwrap();
        assert_eq!(again, first);
    }

    pub async fn an_answer_is_recorded_once_and_consumed_once(ts: &TestStore) {
        let s = start(ts, "run-1").await;
        let fence = s.fence();
        let acme = tenant("acme");
        let early = ts
            .store
            .answer_run(&acme, &s.run_id, "approve", "true", "acme")
            .await
            .unwrap_err();
        assert_eq!(
            early.code(),
            ErrorCode::NotFound,
            "an unarmed checkpoint takes no answer"
        );
        ts.store
            .arm_run_checkpoint(&fence, ask("approve"))
            .await
            .unwrap();
        let first = ts
            .store
            .answer_run(&acme, &s.run_id, "approve", "true", "acme")
            .await
            .unwrap();
        assert!(matches!(first, AnswerRecorded::Recorded(ref a) if a.answerer == "acme"));
        let same = ts
            .store
            .answer_run(&acme, &s.run_id, "approve", " true ", "acme")
            .await
            .unwrap();
        assert!(matches!(same, AnswerRecorded::Unchanged(_)));
        let other = ts
            .store
            .answer_run(&acme, &s.run_id, "approve", "false", "acme")
            .await
            .unwrap_err();
        assert_eq!(other.code(), ErrorCode::Conflict);
        let mut consume = result("approve", "true");
        consume.consumes = Some("approve".into());
        ts.store
            .append_run_step(&fence, consume.clone())
            .await
            .unwrap();
        let answers = ts.store.run_answers(&s.run_id).await.unwrap();
        assert_eq!(answers.len(), 1);
        assert_eq!(answers[0].consumed_epoch, Some(1));
        let twice = ts.store.append_run_step(&fence, consume).await.unwrap_err();
        assert_ne!(twice.code(), ErrorCode::ClaimLost);
        let late = ts
            .store
            .answer_run(&acme, &s.run_id, "approve", "true", "acme")
            .await;
        assert!(matches!(late, Ok(AnswerRecorded::Unchanged(_))), "{late:?}");
        ts.store
            .arm_run_checkpoint(&fence, ask("second"))
            .await
            .unwrap();
        let mut unanswered = result("second", "1");
        unanswered.consumes = Some("second".into());
        let err = ts
            .store
            .append_run_step(&fence, unanswered)
            .await
            .unwrap_err();
        assert_eq!(
            err.code(),
            ErrorCode::State,
            "a driver cannot consume an answer nobody gave"
        );
        assert_eq!(ts.store.run_journal(&s.run_id).await.unwrap().len(), 1);
    }

    pub async fn a_finished_run_is_final(ts: &TestStore) {
        let s = start(ts, "run-1").await;
        let fence = s.fence();
        ts.store
            .arm_run_checkpoint(&fence, ask("approve"))
            .await
            .unwrap();
        let failed = ts
            .store
            .end_run(
                &fence,
                RunEnd::Failed(RunFailure {
                    code: "step_failed".into(),
                    step: "approve".into(),
                    message: "no".into(),
                }),
            )
            .await
            .unwrap();
        assert_eq!(failed.state, RunState::Failed);
        assert_eq!(failed.failure.as_ref().unwrap().code, "step_failed");
        let acme = tenant("acme");
        let answer = ts
            .store
            .answer_run(&acme, &s.run_id, "approve", "true", "acme")
            .await
            .unwrap_err();
        assert_eq!(answer.code(), ErrorCode::State);
        let cancel = ts.store.cancel_run(&acme, &s.run_id).await.unwrap_err();
        assert_eq!(cancel.code(), ErrorCode::State);
        let take = ts
            .store
            .take_run(Takeover {
                run_id: s.run_id.clone(),
                expected_epoch: 1,
                holder: "host-a/2".into(),
                fencing_token: "t2".into(),
                lease: Duration::from_secs(5),
                rule: TakeoverRule::HeldByOrExpired("host-a/".into()),
            })
            .await
            .unwrap_err();
        assert_eq!(take.code(), ErrorCode::State);
        let end = ts
            .store
            .end_run(&fence, RunEnd::Completed)
            .await
            .unwrap_err();
        assert_eq!(end.code(), ErrorCode::ClaimLost);
        let now = ts.store.run_status(None, &s.run_id).await.unwrap().unwrap();
        assert_eq!(now, failed);
    }

    pub async fn a_cancelled_run_fences_its_driver_out(ts: &TestStore) {
        let s = start(ts, "run-1").await;
        let cancelled = ts
            .store
            .cancel_run(&tenant("acme"), &s.run_id)
            .await
            .unwrap();
        assert_eq!(cancelled.state, RunState::Cancelled);
        let err = ts
            .store
            .append_run_step(&s.fence(), result("one", "1"))
            .await
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::ClaimLost);
    }

    pub async fn answering_an_attention_point_hands_the_run_back_for_a_takeover(ts: &TestStore) {
        let s = start(ts, "run-1").await;
        let fence = s.fence();
        ts.store
            .arm_run_checkpoint(
                &fence,
                NewCheckpoint {
                    name: "charge".into(),
                    kind: CheckpointKind::Attention,
                    question: Some("outcome unknown".into()),
                    schema: None,
                    sleep: None,
                },
            )
            .await
            .unwrap();
        let parked = ts
            .store
            .end_run(
                &fence,
                RunEnd::NeedsAttention {
                    step: "charge".into(),
                },
            )
            .await
            .unwrap();
        assert_eq!(parked.state, RunState::NeedsAttention);
        let take = Takeover {
            run_id: s.run_id.clone(),
            expected_epoch: 1,
            holder: "host-b/1".into(),
            fencing_token: "tb".into(),
            lease: Duration::from_secs(5),
            rule: TakeoverRule::LeaseExpired,
        };
        let refused = ts.store.take_run(take.clone()).await.unwrap_err();
        assert_eq!(
            refused.code(),
            ErrorCode::State,
            "no driver takes a run waiting for an operator"
        );
        ts.store
            .answer_run(
                &tenant("acme"),
                &s.run_id,
                "charge",
                r#"{"action":"retry"}"#,
                "acme",
            )
            .await
            .unwrap();
        let back = ts.store.run_status(None, &s.run_id).await.unwrap().unwrap();
        assert_eq!(back.state, RunState::Running);
        let taken = ts.store.take_run(take).await.unwrap();
        assert_eq!(taken.epoch, 2);
    }

    pub async fn status_and_list_reads_change_no_revision(ts: &TestStore) {
        let s = start(ts, "run-1").await;
        for _ in 0..20 {
            ts.store
                .run_status(Some(&tenant("acme")), &s.run_id)
                .await
                .unwrap();
            ts.store.runs(&tenant("acme")).await.unwrap();
            ts.store.run_journal(&s.run_id).await.unwrap();
        }
        let after = ts.store.run_status(None, &s.run_id).await.unwrap().unwrap();
        assert_eq!(after, s);
    }

    pub async fn running_runs_are_listed_across_tenants_for_reconcile(ts: &TestStore) {
        let a = start(ts, "run-a").await;
        let mut other = new_run("run-b", None);
        other.tenant = tenant("globex");
        ts.store.create_run(other).await.unwrap();
        ts.store
            .end_run(&a.fence(), RunEnd::Completed)
            .await
            .unwrap();
        let running = ts
            .store
            .runs_in_state(RunState::Running, 100)
            .await
            .unwrap();
        let ids: Vec<&str> = running.iter().map(|s| s.run_id.as_str()).collect();
        assert_eq!(ids, ["run-b"]);
    }

    /// What a prune of recorded releases asks: the live runs (running or needing attention)
    /// pinned to an identity, with their digests; a finished run pins nothing any more.
    pub async fn only_live_runs_count_as_pinned_to_a_release(ts: &TestStore) {
        for (id, digit) in [("run-1", 'a'), ("run-2", 'b'), ("run-3", 'a')] {
            let mut r = new_run(id, None);
            r.pins = vec![pin("shop/wc@1.0.0", digit), pin("shop/other@1.0.0", 'c')];
            ts.store.create_run(r).await.unwrap();
        }
        let finished = ts
            .store
            .run_status(Some(&tenant("acme")), &RunId::new("run-3").unwrap())
            .await
            .unwrap()
            .unwrap();
        ts.store
            .end_run(&finished.fence(), RunEnd::Completed)
            .await
            .unwrap();
        let live = ts
            .store
            .live_runs_pinned_to("shop/wc@1.0.0", 10)
            .await
            .unwrap();
        let got: Vec<(&str, &str)> = live
            .iter()
            .map(|(run, p)| (run.as_str(), p.digest.as_str()))
            .collect();
        let a = format!("sha256:{}", "a".repeat(64));
        let b = format!("sha256:{}", "b".repeat(64));
        assert_eq!(got, [("run-1", a.as_str()), ("run-2", b.as_str())]);
        assert!(
            ts.store
                .live_runs_pinned_to("shop/nothing@1.0.0", 10)
                .await
                .unwrap()
                .is_empty()
        );
        assert_eq!(
            ts.store
                .live_runs_pinned_to("shop/wc@1.0.0", 1)
                .await
                .unwrap()
                .len(),
            1,
            "the limit holds"
        );
    }

    pub async fn a_run_is_recorded_with_the_releases_it_is_pinned_to(ts: &TestStore) {
        let mut r = new_run("run-1", None);
        r.pins = vec![pin("shop/b@1.0.0", 'b'), pin("shop/a@2.0.0", 'a')];
        let s = ts.store.create_run(r).await.unwrap().status;
        assert_eq!(
            ts.store.run_pins(&s.run_id).await.unwrap(),
            [pin("shop/a@2.0.0", 'a'), pin("shop/b@1.0.0", 'b')],
            "every pin, by identity"
        );
        let other = start(ts, "run-2").await;
        assert!(ts.store.run_pins(&other.run_id).await.unwrap().is_empty());
        // A retried start (same key) writes nothing, pins included.
        let mut keyed = new_run("run-3", Some("k"));
        keyed.pins = vec![pin("shop/a@2.0.0", 'a')];
        let first = ts.store.create_run(keyed.clone()).await.unwrap().status;
        keyed.run_id = RunId::new("run-4").unwrap();
        keyed.pins = vec![pin("shop/a@2.0.0", 'c')];
        let again = ts.store.create_run(keyed).await.unwrap();
        assert!(!again.created);
        assert_eq!(again.status.run_id, first.run_id);
        assert_eq!(
            ts.store.run_pins(&first.run_id).await.unwrap(),
            [pin("shop/a@2.0.0", 'a')]
        );
        assert!(
            ts.store
                .run_pins(&RunId::new("run-4").unwrap())
                .await
                .unwrap()
                .is_empty()
        );
    }

    pub async fn a_run_recorded_without_pins_is_pinned_once_under_its_fence(ts: &TestStore) {
        let s = start(ts, "run-1").await;
        let taken = ts
            .store
            .take_run(Takeover {
                run_id: s.run_id.clone(),
                expected_epoch: 1,
                holder: "host-a/attempt-2".into(),
                fencing_token: "token-2".into(),
                lease: Duration::from_secs(60),
                rule: TakeoverRule::HeldByOrExpired("host-a/".into()),
            })
            .await
            .unwrap();
        let stale = ts
            .store
            .pin_run(&s.fence(), vec![pin("shop/a@1.0.0", 'a')])
            .await
            .unwrap_err();
        assert_eq!(stale.code(), ErrorCode::ClaimLost, "{stale}");
        assert!(ts.store.run_pins(&s.run_id).await.unwrap().is_empty());
        let pinned = ts
            .store
            .pin_run(&taken.fence(), vec![pin("shop/a@1.0.0", 'a')])
            .await
            .unwrap();
        assert_eq!(pinned, [pin("shop/a@1.0.0", 'a')]);
        let again = ts
            .store
            .pin_run(
                &taken.fence(),
                vec![pin("shop/a@1.0.0", 'b'), pin("shop/c@1.0.0", 'c')],
            )
            .await
            .unwrap();
        assert_eq!(
            again,
            [pin("shop/a@1.0.0", 'a')],
            "the first pinning stands"
        );
        assert_eq!(ts.store.run_pins(&s.run_id).await.unwrap(), again);
        ts.store
            .end_run(&taken.fence(), RunEnd::Completed)
            .await
            .unwrap();
        let done = ts
            .store
            .pin_run(&taken.fence(), vec![pin("shop/d@1.0.0", 'd')])
            .await
            .unwrap_err();
        assert_eq!(
            done.code(),
            ErrorCode::ClaimLost,
            "a finished run is not pinned: {done}"
        );
    }

    pub async fn a_released_run_is_free_to_take_at_once_and_only_its_holder_releases_it(
        ts: &TestStore,
    ) {
        let s = start(ts, "run-1").await;
        let take = |epoch| Takeover {
            run_id: s.run_id.clone(),
            expected_epoch: epoch,
            holder: "host-b/attempt-1".into(),
            fencing_token: format!("token-b-{epoch}"),
            lease: Duration::from_secs(60),
            rule: TakeoverRule::LeaseExpired,
        };
        let held = ts.store.take_run(take(1)).await.unwrap_err();
        assert_eq!(held.code(), ErrorCode::ClaimHeld, "{held}");
        let mut stale = s.fence();
        stale.token = "not-the-token".into();
        let err = ts.store.release_run(&stale).await.unwrap_err();
        assert_eq!(err.code(), ErrorCode::ClaimLost, "{err}");
        ts.store.release_run(&s.fence()).await.unwrap();
        let taken = ts.store.take_run(take(1)).await.unwrap();
        assert_eq!((taken.epoch, taken.state), (2, RunState::Running));
        let err = ts.store.release_run(&s.fence()).await.unwrap_err();
        assert_eq!(
            err.code(),
            ErrorCode::ClaimLost,
            "the old holder releases nothing: {err}"
        );
    }

    pub async fn bad_pins_are_refused_with_a_typed_error(ts: &TestStore) {
        let bad = [
            vec![RunPin {
                identity: "shop/a@1.0.0".into(),
                digest: "sha256:ABC".into(),
            }],
            vec![RunPin {
                identity: "shop/a @1.0.0".into(),
                digest: pin("x", 'a').digest,
            }],
            vec![pin("shop/a@1.0.0", 'a'), pin("shop/a@1.0.0", 'b')],
            (0..=sessionstore::runs::MAX_RUN_PINS)
                .map(|i| pin(&format!("shop/n{i}@1.0.0"), 'a'))
                .collect(),
        ];
        for pins in bad {
            let mut r = new_run("run-1", None);
            r.pins = pins;
            let err = ts.store.create_run(r).await.unwrap_err();
            assert_eq!(err.code(), ErrorCode::Invalid, "{err}");
        }
        assert!(ts.store.runs(&tenant("acme")).await.unwrap().is_empty());
        let s = start(ts, "run-1").await;
        let err = ts
            .store
            .pin_run(&s.fence(), vec![pin("", 'a')])
            .await
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::Invalid, "{err}");
    }

    pub async fn a_run_keeps_the_trace_it_was_started_in_through_a_takeover(ts: &TestStore) {
        let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let trace = TraceContext::from_headers(Some(parent), Some("vendor=1")).unwrap();
        let mut traced = new_run("run-1", Some("k"));
        traced.trace = trace.clone();
        let s = ts.store.create_run(traced).await.unwrap().status;
        assert_eq!(s.trace, trace);
        let untraced = start(ts, "run-2").await;
        assert_eq!(untraced.trace, None);
        // A retried start under another trace keeps the first one.
        let mut retry = new_run("run-3", Some("k"));
        retry.trace = TraceContext::from_headers(
            Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
            None,
        )
        .unwrap();
        let again = ts.store.create_run(retry).await.unwrap();
        assert!(!again.created);
        assert_eq!(again.status.trace, trace);
        // Whoever takes the run over reads the same trace.
        let taken = taken_by_host_b(ts, &s).await;
        assert_eq!(taken.epoch, 2);
        assert_eq!(taken.trace, trace);
        let listed = ts.store.runs(&tenant("acme")).await.unwrap();
        let traces: Vec<_> = listed.iter().map(|r| r.trace.clone()).collect();
        assert_eq!(traces, vec![trace, None]);
    }

    pub async fn a_run_keeps_who_started_it_and_one_started_by_nobody_known_reads_as_unknown(
        ts: &TestStore,
    ) {
        let started = start(ts, "run-1").await;
        assert_eq!(started.started_by.as_deref(), Some("user:ann"));
        let mut anonymous = new_run("run-2", None);
        anonymous.started_by = None;
        ts.store.create_run(anonymous).await.unwrap();
        let read = |id: &str| {
            let store = ts.store.clone();
            let id = RunId::new(id).unwrap();
            async move { store.run_status(None, &id).await.unwrap().unwrap() }
        };
        assert_eq!(read("run-1").await.started_by.as_deref(), Some("user:ann"));
        assert_eq!(read("run-2").await.started_by, None);
        let listed = ts.store.runs(&tenant("acme")).await.unwrap();
        let by: Vec<_> = listed.iter().map(|r| r.started_by.clone()).collect();
        assert_eq!(by, vec![Some("user:ann".to_owned()), None]);
        // A retried start with its key keeps the first starter.
        let mut first = new_run("run-3", Some("k"));
        first.started_by = Some("user:bob".into());
        ts.store.create_run(first).await.unwrap();
        let mut retry = new_run("run-4", Some("k"));
        retry.started_by = Some("user:eve".into());
        let again = ts.store.create_run(retry).await.unwrap();
        assert!(!again.created);
        assert_eq!(again.status.started_by.as_deref(), Some("user:bob"));
        let mut empty = new_run("run-5", None);
        empty.started_by = Some(String::new());
        let err = ts.store.create_run(empty).await.unwrap_err();
        assert_eq!(err.code(), ErrorCode::Invalid, "{err}");
    }

    pub async fn bad_run_input_is_refused_with_a_typed_error(ts: &TestStore) {
        let mut no_json = new_run("run-1", None);
        no_json.input = "{not json".into();
        let mut empty = new_run("run-1", None);
        empty.source = String::new();
        for r in [no_json, empty] {
            let err = ts.store.create_run(r).await.unwrap_err();
            assert_eq!(err.code(), ErrorCode::Invalid, "{err}");
        }
        assert!(ts.store.runs(&tenant("acme")).await.unwrap().is_empty());
    }
}

sessionstore::both_backends!(cases =>
    a_tenants_runs_mark_moves_with_each_status_change_and_only_its_own,
    a_tenants_runs_are_read_in_pages_either_way_and_a_foreign_cursor_is_not_found,
    only_live_runs_count_as_pinned_to_a_release,
    a_run_is_recorded_with_its_exact_program_and_a_first_status_at_epoch_one,
    a_start_retried_with_its_idempotency_key_returns_the_first_run,
    another_tenants_run_reads_exactly_like_an_unknown_one,
    a_step_has_at_most_one_result,
    after_a_takeover_every_write_under_the_old_fence_is_refused,
    a_takeover_needs_the_read_epoch_and_an_expired_lease_of_another_holder,
    a_run_is_free_once_its_hosts_registration_expires_even_under_a_live_lease,
    a_sleep_armed_again_keeps_its_first_deadline,
    a_parked_run_names_no_holder_and_takes_no_write_under_its_fence,
    parking_at_an_answered_ask_writes_nothing_and_says_so,
    an_answer_or_a_deadline_makes_a_parked_run_due_for_any_host,
    an_answer_is_recorded_once_and_consumed_once,
    a_finished_run_is_final,
    a_cancelled_run_fences_its_driver_out,
    answering_an_attention_point_hands_the_run_back_for_a_takeover,
    status_and_list_reads_change_no_revision,
    running_runs_are_listed_across_tenants_for_reconcile,
    bad_run_input_is_refused_with_a_typed_error,
    a_run_keeps_who_started_it_and_one_started_by_nobody_known_reads_as_unknown,
    a_run_keeps_the_trace_it_was_started_in_through_a_takeover,
    a_run_is_recorded_with_the_releases_it_is_pinned_to,
    a_run_recorded_without_pins_is_pinned_once_under_its_fence,
    bad_pins_are_refused_with_a_typed_error,
    a_released_run_is_free_to_take_at_once_and_only_its_holder_releases_it,
);
