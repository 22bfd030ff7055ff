//! The run driver over real stores (SQLite and PostgreSQL): replay, fencing, answers,
//! supervision, uncertainty, and crash injection at every step boundary with an exactly-once
//! checker.

mod runs_support;

mod cases {
    use std::sync::Arc;
    use std::time::Duration;

    use runnable::{Effect, OutcomeClass};
    use serde_json::{Value, json};
    use sessionstore::testing::TestStore;
    use sessionstore::*;
    use tokio::sync::Notify;
    use tokio_util::sync::CancellationToken;
    use workflow::{DriveEnd, Driver, DriverOptions, NoEvents, RunJournal, failure_codes};

    use super::runs_support::*;

    const CHECKED: &str = "\
steps:
  - name: read
    invoke: read@1.0.0
    input: {order: \"${input.order}\"}
  - name: charge
    invoke: charge@1.0.0
    input: {amount: \"${steps.read.echo.order}\"}
  - name: approve
    ask: Ship order ${input.order}?
    answer: {type: boolean}
  - name: nap
    sleep: 30ms
  - name: notify
    invoke: notify@1.0.0
    input: {approved: \"${steps.approve}\"}
";

    fn driver(world: &Arc<World>, journal: Arc<dyn RunJournal>) -> Driver {
        Driver {
            journal,
            env: world.clone(),
            releases: Arc::new(workflow::AsResolved(world.clone())),
            invoker: world.clone(),
            agents: Some(world.clone()),
            events: Arc::new(NoEvents),
            options: DriverOptions {
                lease: Duration::from_secs(30),
                poll: Duration::from_millis(20),
                park: None,
            },
        }
    }

    async fn drive(world: &Arc<World>, store: &Store, status: RunStatus) -> DriveEnd {
        driver(world, Arc::new(store.clone()))
            .drive(status, Arc::new(Notify::new()), CancellationToken::new())
            .await
            .unwrap()
    }

    /// Answers every open ask with `true` and every attention point with a skip.
    async fn answer_open(store: &Store, run: &RunId) {
        let answers = store.run_answers(run).await.unwrap();
        let journal = store.run_journal(run).await.unwrap();
        for c in store.run_checkpoints(run).await.unwrap() {
            let done = journal
                .iter()
                .any(|e| e.step == c.name && e.kind == StepEntryKind::Result);
            if done || answers.iter().any(|a| a.checkpoint == c.name) {
                continue;
            }
            let value = match c.kind {
                CheckpointKind::Ask => json!(true),
                CheckpointKind::Attention => json!({"action": "skip", "output": {"skipped": true}}),
                CheckpointKind::Sleep => continue,
            };
            let _ = store
                .answer_run(&tenant(), run, &c.name, &value.to_string(), "acme")
                .await;
        }
    }

    /// Restarts drivers (each under epoch + 1) until the run is finished; a run needing more
    /// than eight attempts counts as wedged.
    async fn drive_to_end(world: &Arc<World>, store: &Store, run: &RunId) -> RunStatus {
        for attempt in 2..10u64 {
            let s = store.run_status(None, run).await.unwrap().unwrap();
            if s.state.is_terminal() {
                return s;
            }
            answer_open(store, run).await;
            let taken = take_back(store, run, attempt).await;
            let task = tokio::spawn({
                let (world, store) = (world.clone(), store.clone());
                async move { drive(&world, &store, taken).await }
            });
            while !task.is_finished() {
                answer_open(store, run).await;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            task.await.unwrap();
        }
        panic!("run {run} is wedged");
    }

    async fn check_exactly_once(world: &Arc<World>, store: &Store, run: &RunId, what: &str) {
        let s = store.run_status(None, run).await.unwrap().unwrap();
        assert_eq!(s.state, RunState::Completed, "{what}: {s:?}");
        let journal = store.run_journal(run).await.unwrap();
        for step in ["read", "charge", "approve", "nap", "notify"] {
            let results = journal
                .iter()
                .filter(|e| e.step == step && e.kind == StepEntryKind::Result)
                .count();
            assert_eq!(results, 1, "{what}: step {step} has one result");
        }
        for name in ["read", "notify"] {
            let calls = world.calls_of(name);
            assert!(!calls.is_empty(), "{what}: {name} ran");
            assert!(
                calls.iter().all(|c| c.effect_id == calls[0].effect_id
                    && c.intent_id == calls[0].intent_id),
                "{what}: every execution of {name} carries the same ids"
            );
            assert_eq!(
                world.applied_of(&calls[0].effect_id),
                1,
                "{what}: {name} applied once"
            );
        }
        let charges = world.calls_of("charge");
        assert!(
            charges.len() <= 1,
            "{what}: the effectful step ran at most once: {charges:?}"
        );
        let charge = journal
            .iter()
            .find(|e| e.step == "charge" && e.kind == StepEntryKind::Result)
            .unwrap();
        if charge.outcome.as_deref() == Some("succeeded") {
            assert_eq!(charges.len(), 1, "{what}: a certain success happened once");
        }
        let answers = store.run_answers(run).await.unwrap();
        let asked: Vec<_> = answers
            .iter()
            .filter(|a| a.checkpoint == "approve")
            .collect();
        assert_eq!(asked.len(), 1, "{what}: one answer");
        assert!(
            asked[0].consumed_at_ms.is_some(),
            "{what}: the answer was consumed"
        );
        let notify_input = &world.calls_of("notify")[0].input;
        assert_eq!(
            notify_input,
            &json!({"approved": true}),
            "{what}: the answer reached the later step"
        );
    }

    pub async fn a_run_completes_with_every_step_journaled_once(ts: &TestStore) {
        let world = World::new();
        let s = start(&ts.store, &world, "run-1", CHECKED, json!({"order": "o-7"})).await;
        let run = s.run_id.clone();
        let task = tokio::spawn({
            let (world, store) = (world.clone(), ts.store.clone());
            async move { drive(&world, &store, s).await }
        });
        while !task.is_finished() {
            answer_open(&ts.store, &run).await;
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(task.await.unwrap(), DriveEnd::Completed);
        check_exactly_once(&world, &ts.store, &run, "no crash").await;
        let status = ts.store.run_status(None, &run).await.unwrap().unwrap();
        assert_eq!(status.epoch, 1);
    }

    pub async fn a_crash_at_every_write_boundary_keeps_every_effect_exactly_once(ts: &TestStore) {
        // Count the writes of an undisturbed run first.
        let world = World::new();
        let s = start(&ts.store, &world, "count", CHECKED, json!({"order": "o-7"})).await;
        let counter = CrashingJournal::new(ts.store.clone(), None);
        let task = tokio::spawn({
            let (world, counter, s) = (world.clone(), counter.clone(), s.clone());
            async move {
                driver(&world, counter)
                    .drive(s, Arc::new(Notify::new()), CancellationToken::new())
                    .await
            }
        });
        while !task.is_finished() {
            answer_open(&ts.store, &s.run_id).await;
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(task.await.unwrap().unwrap(), DriveEnd::Completed);
        let writes = counter.writes.load(std::sync::atomic::Ordering::SeqCst);
        assert!(writes >= 9, "{writes} writes");
        for at in 0..writes {
            for crash in [Crash::Before, Crash::After] {
                let what = format!("crash {crash:?} write {at}");
                let world = World::new();
                let id = format!("run-{at}-{crash:?}").to_lowercase();
                let s = start(&ts.store, &world, &id, CHECKED, json!({"order": "o-7"})).await;
                let run = s.run_id.clone();
                let journal = CrashingJournal::new(ts.store.clone(), Some((at, crash)));
                let task = tokio::spawn({
                    let (world, journal) = (world.clone(), journal.clone());
                    async move {
                        driver(&world, journal)
                            .drive(s, Arc::new(Notify::new()), CancellationToken::new())
                            .await
                    }
                });
                tokio::select! {
                    _ = journal.crashed.notified() => {}
                    _ = async {
                        loop {
                            answer_open(&ts.store, &run).await;
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                    } => {}
                }
                task.abort();
                let _ = task.await;
                drive_to_end(&world, &ts.store, &run).await;
                check_exactly_once(&world, &ts.store, &run, &what).await;
            }
        }
    }

    pub async fn a_crash_mid_invoke_reruns_replay_safe_steps_and_parks_effectful_ones(
        ts: &TestStore,
    ) {
        // Calls 0, 1, 2 are read, charge and notify in an undisturbed run.
        for (hang, name) in [(0usize, "read"), (1, "charge"), (2, "notify")] {
            let world = World::new();
            *world.hang_at.lock().unwrap() = Some(hang);
            let id = format!("mid-{name}");
            let s = start(&ts.store, &world, &id, CHECKED, json!({"order": "o-7"})).await;
            let run = s.run_id.clone();
            let task = tokio::spawn({
                let (world, store) = (world.clone(), ts.store.clone());
                async move { drive(&world, &store, s).await }
            });
            tokio::select! {
                _ = world.hung.notified() => {}
                _ = async {
                    loop {
                        answer_open(&ts.store, &run).await;
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                } => {}
            }
            task.abort();
            let _ = task.await;
            *world.hang_at.lock().unwrap() = None;
            if name == "charge" {
                // The effect is unknown: the run waits for an operator, it is not re-run.
                let taken = take_back(&ts.store, &run, 2).await;
                let end = drive(&world, &ts.store, taken).await;
                assert_eq!(
                    end,
                    DriveEnd::NeedsAttention {
                        step: "charge".into(),
                        checkpoint: "charge.attempt-1".into()
                    }
                );
                let status = ts.store.run_status(None, &run).await.unwrap().unwrap();
                assert_eq!(status.state, RunState::NeedsAttention);
                assert_eq!(world.calls_of("charge").len(), 1);
            }
            drive_to_end(&world, &ts.store, &run).await;
            check_exactly_once(&world, &ts.store, &run, &format!("hang in {name}")).await;
        }
    }

    pub async fn an_operator_retry_runs_an_uncertain_effectful_step_once_more(ts: &TestStore) {
        let world = World::new().with(
            "shop/charge@1.0.0",
            Effect::Effectful,
            Behaviour::Uncertain(OutcomeClass::TimedOut),
        );
        let source = "steps:\n  - name: charge\n    invoke: charge@1.0.0\n";
        let s = start(&ts.store, &world, "run-1", source, json!({})).await;
        let run = s.run_id.clone();
        let end = drive(&world, &ts.store, s).await;
        assert!(matches!(end, DriveEnd::NeedsAttention { .. }), "{end:?}");
        let wrong = ts
            .store
            .answer_run(
                &tenant(),
                &run,
                "charge.attempt-1",
                r#"{"action":"retry"}"#,
                "acme",
            )
            .await
            .unwrap();
        assert!(matches!(wrong, AnswerRecorded::Recorded(_)));
        let taken = take_back(&ts.store, &run, 2).await;
        let end = drive(&world, &ts.store, taken).await;
        assert_eq!(
            end,
            DriveEnd::NeedsAttention {
                step: "charge".into(),
                checkpoint: "charge.attempt-2".into()
            },
            "the retry ran once and ended uncertain again"
        );
        assert_eq!(world.calls_of("charge").len(), 2);
        let answers = ts.store.run_answers(&run).await.unwrap();
        assert!(
            answers[0].consumed_at_ms.is_some(),
            "the retry consumed its answer"
        );
        ts.store
            .answer_run(
                &tenant(),
                &run,
                "charge.attempt-2",
                r#"{"action":"skip","output":{"manual":true}}"#,
                "acme",
            )
            .await
            .unwrap();
        let taken = take_back(&ts.store, &run, 3).await;
        assert_eq!(drive(&world, &ts.store, taken).await, DriveEnd::Completed);
        assert_eq!(world.calls_of("charge").len(), 2);
        let journal = ts.store.run_journal(&run).await.unwrap();
        let result = journal
            .iter()
            .find(|e| e.kind == StepEntryKind::Result)
            .unwrap();
        assert_eq!(result.outcome.as_deref(), Some("skipped"));
        assert_eq!(result.body, r#"{"output":{"manual":true}}"#);
    }

    pub async fn an_uncertain_outcome_is_journaled_as_its_class_and_never_as_success(
        ts: &TestStore,
    ) {
        for class in [
            OutcomeClass::Crashed,
            OutcomeClass::TimedOut,
            OutcomeClass::InvalidOutput,
            OutcomeClass::Cancelled,
        ] {
            let world = World::new().with(
                "shop/read@1.0.0",
                Effect::ReadOnly,
                Behaviour::Uncertain(class),
            );
            let source = "steps:\n  - name: read\n    invoke: read@1.0.0\n";
            let id = format!("run-{}", class.as_str().replace('_', "-"));
            let s = start(&ts.store, &world, &id, source, json!({})).await;
            let end = drive(&world, &ts.store, s.clone()).await;
            assert_eq!(
                end,
                DriveEnd::Failed {
                    code: failure_codes::STEP_UNCERTAIN.into(),
                    step: "read".into()
                }
            );
            let journal = ts.store.run_journal(&s.run_id).await.unwrap();
            assert_eq!(journal.len(), 1);
            assert_eq!(journal[0].kind, StepEntryKind::Failure);
            assert_eq!(journal[0].outcome.as_deref(), Some(class.as_str()));
        }
    }

    pub async fn a_supervised_step_reruns_in_place_within_its_budget(ts: &TestStore) {
        let world = World::new().with("shop/read@1.0.0", Effect::ReadOnly, Behaviour::FailFirst(2));
        let source =
            "steps:\n  - name: read\n    invoke: read@1.0.0\n    supervise: {restarts: 2}\n";
        let s = start(&ts.store, &world, "run-ok", source, json!({})).await;
        assert_eq!(
            drive(&world, &ts.store, s.clone()).await,
            DriveEnd::Completed
        );
        let calls = world.calls_of("read");
        assert_eq!(calls.len(), 3);
        assert!(calls.iter().all(|c| c.effect_id == calls[0].effect_id));
        let journal = ts.store.run_journal(&s.run_id).await.unwrap();
        let failures = journal
            .iter()
            .filter(|e| e.kind == StepEntryKind::Failure)
            .count();
        assert_eq!(failures, 2);
    }

    pub async fn a_supervised_step_past_its_budget_fails_the_run_with_a_stable_code(
        ts: &TestStore,
    ) {
        let world = World::new().with("shop/read@1.0.0", Effect::ReadOnly, Behaviour::AlwaysFail);
        let source = "steps:\n  - name: read\n    invoke: read@1.0.0\n    supervise: {restarts: 2}\n  - name: later\n    sleep: 0s\n";
        let s = start(&ts.store, &world, "run-bad", source, json!({})).await;
        let end = drive(&world, &ts.store, s.clone()).await;
        assert_eq!(
            end,
            DriveEnd::Failed {
                code: failure_codes::STEP_FAILED.into(),
                step: "read".into()
            }
        );
        assert_eq!(world.calls_of("read").len(), 3);
        let status = ts.store.run_status(None, &s.run_id).await.unwrap().unwrap();
        assert_eq!(status.state, RunState::Failed);
        let failure = status.failure.unwrap();
        assert_eq!(
            (failure.code.as_str(), failure.step.as_str()),
            ("step_failed", "read")
        );
    }

    pub async fn the_restart_budget_survives_a_driver_restart(ts: &TestStore) {
        let world = World::new().with("shop/read@1.0.0", Effect::ReadOnly, Behaviour::AlwaysFail);
        let source =
            "steps:\n  - name: read\n    invoke: read@1.0.0\n    supervise: {restarts: 2}\n";
        let s = start(&ts.store, &world, "run-1", source, json!({})).await;
        // One failed attempt is journaled by an earlier driver.
        ts.store
            .append_run_step(
                &s.fence(),
                NewStepEntry {
                    step: "read".into(),
                    kind: StepEntryKind::Failure,
                    attempt: 1,
                    outcome: Some("failed".into()),
                    body: "{}".into(),
                    started_at_ms: None,
                    consumes: None,
                },
            )
            .await
            .unwrap();
        let taken = take_back(&ts.store, &s.run_id, 2).await;
        let end = drive(&world, &ts.store, taken).await;
        assert!(matches!(end, DriveEnd::Failed { .. }), "{end:?}");
        assert_eq!(
            world.calls_of("read").len(),
            2,
            "three attempts in total, not four"
        );
    }

    pub async fn a_driver_whose_fence_went_stale_stops_without_writing(ts: &TestStore) {
        let world = World::new();
        let s = start(&ts.store, &world, "run-1", CHECKED, json!({"order": "o-7"})).await;
        let run = s.run_id.clone();
        let task = tokio::spawn({
            let (world, store) = (world.clone(), ts.store.clone());
            async move { drive(&world, &store, s).await }
        });
        // Wait until it parks at the ask, then take the run over.
        loop {
            let cps = ts.store.run_checkpoints(&run).await.unwrap();
            if cps.iter().any(|c| c.name == "approve") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let taken = take_back(&ts.store, &run, 2).await;
        assert_eq!(task.await.unwrap(), DriveEnd::Fenced);
        let journal = ts.store.run_journal(&run).await.unwrap();
        assert!(journal.iter().all(|e| e.epoch == 1));
        assert_eq!(world.calls_of("notify").len(), 0);
        let status = ts.store.run_status(None, &run).await.unwrap().unwrap();
        assert_eq!(status.holder, taken.holder);
        // The successor finds the same checkpoint open and proceeds once answered.
        answer_open(&ts.store, &run).await;
        assert_eq!(drive(&world, &ts.store, taken).await, DriveEnd::Completed);
        assert_eq!(ts.store.run_checkpoints(&run).await.unwrap().len(), 2);
    }

    pub async fn a_sleep_after_a_restart_waits_only_what_is_left(ts: &TestStore) {
        let world = World::new();
        let source = "steps:\n  - name: nap\n    sleep: 1500ms\n";
        let s = start(&ts.store, &world, "run-1", source, json!({})).await;
        let run = s.run_id.clone();
        let task = tokio::spawn({
            let (world, store) = (world.clone(), ts.store.clone());
            async move { drive(&world, &store, s).await }
        });
        while ts.store.run_checkpoints(&run).await.unwrap().is_empty() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tokio::time::sleep(Duration::from_millis(400)).await;
        task.abort();
        let _ = task.await;
        ts.advance(Duration::from_millis(1000)).await;
        let taken = take_back(&ts.store, &run, 2).await;
        let began = std::time::Instant::now();
        assert_eq!(drive(&world, &ts.store, taken).await, DriveEnd::Completed);
        assert!(
            began.elapsed() < Duration::from_millis(1200),
            "the restarted sleep waited {:?}",
            began.elapsed()
        );
    }

    pub async fn an_agent_step_takes_the_turns_reply_as_its_result(ts: &TestStore) {
        let world = World::new();
        let source = "steps:\n  - name: hello\n    agent: echo\n    prompt: hi ${input.who}\n";
        let s = start(&ts.store, &world, "run-1", source, json!({"who": "bob"})).await;
        assert_eq!(
            drive(&world, &ts.store, s.clone()).await,
            DriveEnd::Completed
        );
        let journal = ts.store.run_journal(&s.run_id).await.unwrap();
        assert_eq!(journal[0].body, r#"{"output":"You said: hi bob"}"#);
        let turns = world.turns.lock().unwrap().clone();
        assert_eq!(turns.len(), 1);
        assert_eq!(turns[0].idempotency_key, "run-run-1-hello-1");
    }

    pub async fn a_failed_supervised_agent_turn_runs_again_as_a_new_turn_whose_reply_is_the_result(
        ts: &TestStore,
    ) {
        let world = World::new();
        world
            .failing_turns
            .store(1, std::sync::atomic::Ordering::SeqCst);
        let source = "steps:\n  - name: hello\n    agent: echo\n    prompt: hi ${input.who}\n    supervise: {restarts: 1}\n";
        let s = start(&ts.store, &world, "run-1", source, json!({"who": "bob"})).await;
        assert_eq!(
            drive(&world, &ts.store, s.clone()).await,
            DriveEnd::Completed
        );
        let journal = ts.store.run_journal(&s.run_id).await.unwrap();
        let kinds: Vec<(StepEntryKind, u64)> =
            journal.iter().map(|e| (e.kind, e.attempt)).collect();
        assert_eq!(
            kinds,
            [(StepEntryKind::Failure, 1), (StepEntryKind::Result, 0)],
            "{journal:?}"
        );
        assert_eq!(journal[1].body, r#"{"output":"You said: hi bob"}"#);
        // Each attempt is a turn of its own (a fresh session and command per attempt).
        let keys: Vec<String> = world
            .turns
            .lock()
            .unwrap()
            .iter()
            .map(|t| t.idempotency_key.clone())
            .collect();
        assert_eq!(keys, ["run-run-1-hello-1", "run-run-1-hello-2"]);
    }

    pub async fn a_supervise_window_counts_only_the_failures_inside_it(ts: &TestStore) {
        let world = World::new().with("shop/read@1.0.0", Effect::ReadOnly, Behaviour::AlwaysFail);
        let source = "steps:\n  - name: read\n    invoke: read@1.0.0\n    supervise: {restarts: 2, window: 30s}\n";
        let failed = |attempt| NewStepEntry {
            step: "read".into(),
            kind: StepEntryKind::Failure,
            attempt,
            outcome: Some("failed".into()),
            body: "{}".into(),
            started_at_ms: None,
            consumes: None,
        };
        // Two failures an earlier driver journaled long ago no longer count ...
        let old = start(&ts.store, &world, "run-old", source, json!({})).await;
        for attempt in [1, 2] {
            ts.store
                .append_run_step(&old.fence(), failed(attempt))
                .await
                .unwrap();
        }
        // ... one journaled just now does.
        let recent = start(&ts.store, &world, "run-recent", source, json!({})).await;
        ts.advance_instantly(Duration::from_secs(60)).await;
        ts.store
            .append_run_step(&recent.fence(), failed(1))
            .await
            .unwrap();
        let taken = take_back(&ts.store, &old.run_id, 2).await;
        assert!(matches!(
            drive(&world, &ts.store, taken).await,
            DriveEnd::Failed { .. }
        ));
        assert_eq!(
            world.calls_of("read").len(),
            3,
            "the whole budget again: one run and two restarts"
        );
        let taken = take_back(&ts.store, &recent.run_id, 2).await;
        assert!(matches!(
            drive(&world, &ts.store, taken).await,
            DriveEnd::Failed { .. }
        ));
        assert_eq!(
            world.calls_of("read").len(),
            3 + 2,
            "one restart left of the budget"
        );
    }

    pub async fn a_driver_never_records_an_answer_and_waits_for_one_across_restarts(
        ts: &TestStore,
    ) {
        let world = World::new();
        let source = "steps:\n  - name: q\n    ask: go?\n    answer: {type: boolean}\n  - name: after\n    sleep: 0s\n";
        let s = start(&ts.store, &world, "run-1", source, Value::Null).await;
        let run = s.run_id.clone();
        let mut status = s;
        for attempt in 2..4u64 {
            let task = tokio::spawn({
                let (world, store) = (world.clone(), ts.store.clone());
                async move { drive(&world, &store, status).await }
            });
            while ts.store.run_checkpoints(&run).await.unwrap().is_empty() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            // Many polls later, still waiting, and no answer recorded.
            tokio::time::sleep(Duration::from_millis(300)).await;
            assert!(!task.is_finished());
            assert!(ts.store.run_answers(&run).await.unwrap().is_empty());
            task.abort();
            let _ = task.await;
            status = take_back(&ts.store, &run, attempt).await;
        }
        let task = tokio::spawn({
            let (world, store) = (world.clone(), ts.store.clone());
            async move { drive(&world, &store, status).await }
        });
        ts.store
            .answer_run(&tenant(), &run, "q", "true", "acme")
            .await
            .unwrap();
        assert_eq!(task.await.unwrap(), DriveEnd::Completed);
        let answers = ts.store.run_answers(&run).await.unwrap();
        assert_eq!(answers.len(), 1);
        assert_eq!(answers[0].answerer, "acme");
    }

    pub async fn a_rendered_input_that_breaks_the_schema_never_starts_the_handler(ts: &TestStore) {
        let world = World::new();
        let source = "steps:\n  - name: read\n    invoke: read@1.0.0\n    input: \"${input.n}\"\n";
        let s = start(&ts.store, &world, "run-1", source, json!({"n": 3})).await;
        let end = drive(&world, &ts.store, s).await;
        assert_eq!(
            end,
            DriveEnd::Failed {
                code: failure_codes::INPUT_INVALID.into(),
                step: "read".into()
            }
        );
        assert!(world.calls_of("read").is_empty());
    }

    pub async fn a_cancelled_parked_run_stops_its_driver(ts: &TestStore) {
        let world = World::new();
        let source = "steps:\n  - name: q\n    ask: why?\n    answer: {type: string}\n";
        let s = start(&ts.store, &world, "run-1", source, Value::Null).await;
        let run = s.run_id.clone();
        let task = tokio::spawn({
            let (world, store) = (world.clone(), ts.store.clone());
            async move { drive(&world, &store, s).await }
        });
        while ts.store.run_checkpoints(&run).await.unwrap().is_empty() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        ts.store.cancel_run(&tenant(), &run).await.unwrap();
        assert_eq!(task.await.unwrap(), DriveEnd::Cancelled);
    }
}

sessionstore::both_backends!(cases =>
    a_run_completes_with_every_step_journaled_once,
    a_crash_at_every_write_boundary_keeps_every_effect_exactly_once,
    a_crash_mid_invoke_reruns_replay_safe_steps_and_parks_effectful_ones,
    an_operator_retry_runs_an_uncertain_effectful_step_once_more,
    an_uncertain_outcome_is_journaled_as_its_class_and_never_as_success,
    a_supervised_step_reruns_in_place_within_its_budget,
    a_supervised_step_past_its_budget_fails_the_run_with_a_stable_code,
    the_restart_budget_survives_a_driver_restart,
    a_driver_whose_fence_went_stale_stops_without_writing,
    a_sleep_after_a_restart_waits_only_what_is_left,
    an_agent_step_takes_the_turns_reply_as_its_result,
    a_failed_supervised_agent_turn_runs_again_as_a_new_turn_whose_reply_is_the_result,
    a_supervise_window_counts_only_the_failures_inside_it,
    a_driver_never_records_an_answer_and_waits_for_one_across_restarts,
    a_rendered_input_that_breaks_the_schema_never_starts_the_handler,
    a_cancelled_parked_run_stops_its_driver,
);
