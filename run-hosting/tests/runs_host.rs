//! Run hosting over real stores (SQLite and PostgreSQL): the `run.*` handlers as HostLink
//! calls them, the boot gate, the admission cap, boot reconcile and takeover by lease.

mod cases {
    use std::sync::Arc;
    use std::time::Duration;

    use async_trait::async_trait;
    use hostlink::runs::{RunAnswered, RunList, RunRefusal, RunReply, RunStarted, RunView};
    use hostlink_server::backend::{ExtensionReply, Refusal};
    use run_hosting::hosting::{RunHost, RunHosting, RunOptions};
    use runnable::{Effect, OutcomeClass};
    use serde::de::DeserializeOwned;
    use serde_json::{Value, json};
    use sessionstore::testing::TestStore;
    use sessionstore::*;
    use workflow::program::{RunnableInfo, Unresolved, schema_from_yaml};
    use workflow::{AsResolved, Environment, InvokeCall, InvokeDone, Invoker};

    struct Echo;

    impl Environment for Echo {
        fn runnable(&self, reference: &str) -> Result<RunnableInfo, Unresolved> {
            let identity = match reference {
                "echo@1.0.0" | "t/echo@1.0.0" => "t/echo@1.0.0",
                "hold@1.0.0" | "t/hold@1.0.0" => "t/hold@1.0.0",
                _ => {
                    return Err(Unresolved::NotFound {
                        available: Vec::new(),
                    });
                }
            };
            Ok(RunnableInfo {
                identity: identity.into(),
                digest: format!("sha256:{}", "0".repeat(64)),
                effect: Effect::ReadOnly,
                input: schema_from_yaml("type: object\nadditionalProperties: true\n").unwrap(),
            })
        }
        fn agent_known(&self, _: &str) -> bool {
            false
        }
    }

    #[async_trait]
    impl Invoker for Echo {
        async fn invoke(&self, call: InvokeCall) -> Result<InvokeDone, String> {
            if call.identity == "t/hold@1.0.0" {
                // A step that keeps its driver busy for a while.
                tokio::time::sleep(HOLD_FOR).await;
            }
            Ok(InvokeDone {
                outcome: OutcomeClass::Succeeded,
                output: Some(call.input),
                detail: String::new(),
            })
        }
    }

    /// An invoker whose call ends when the test lets it (succeeded), or when its `cancel`
    /// fires (cancelled, as `runnable::invoke` ends a handler it stopped), counting both.
    #[derive(Default)]
    struct Held {
        begun: std::sync::atomic::AtomicUsize,
        cancelled: std::sync::atomic::AtomicUsize,
        finish: tokio::sync::Notify,
    }

    #[async_trait]
    impl Invoker for Held {
        async fn invoke(&self, call: InvokeCall) -> Result<InvokeDone, String> {
            use std::sync::atomic::Ordering::SeqCst;
            self.begun.fetch_add(1, SeqCst);
            tokio::select! {
                _ = self.finish.notified() => Ok(InvokeDone {
                    outcome: OutcomeClass::Succeeded,
                    output: Some(call.input),
                    detail: String::new(),
                }),
                _ = call.cancel.cancelled() => {
                    self.cancelled.fetch_add(1, SeqCst);
                    Ok(InvokeDone {
                        outcome: OutcomeClass::Cancelled,
                        output: None,
                        detail: "stopped".into(),
                    })
                }
            }
        }
    }

    fn held_host(store: &Store, id: &str, held: &Arc<Held>) -> RunHost {
        RunHost::new(RunHosting {
            store: store.clone(),
            host_id: HostId::new(id).unwrap(),
            env: Arc::new(Echo),
            releases: Arc::new(AsResolved(Arc::new(Echo))),
            invoker: held.clone(),
            agents: None,
            options: options(8, 5000),
            metrics: None,
        })
    }

    const TWO_STEPS: &str = "steps:\n  - name: first\n    invoke: echo@1.0.0\n    input: {n: 1}\n  - name: second\n    invoke: echo@1.0.0\n    input: {n: 2}\n";

    const PARKS: &str = "steps:\n  - name: first\n    invoke: echo@1.0.0\n    input: {n: 1}\n  - name: approve\n    ask: ok?\n    answer: {type: boolean}\n  - name: last\n    invoke: echo@1.0.0\n    input: {ok: \"${steps.approve}\"}\n";
    /// A run whose first step keeps its driver busy for [`HOLD_FOR`].
    const HOLDS: &str = "steps:\n  - name: busy\n    invoke: hold@1.0.0\n";
    const HOLD_FOR: Duration = Duration::from_millis(1500);
    /// A run that sleeps longer than the scan interval: it parks.
    const NAPS: &str =
        "steps:\n  - name: nap\n    sleep: 600ms\n  - name: after\n    invoke: echo@1.0.0\n";
    const QUICK: &str =
        "steps:\n  - name: first\n    invoke: echo@1.0.0\n  - name: nap\n    sleep: 0s\n";

    fn options(max_active: u32, lease_ms: u64) -> RunOptions {
        RunOptions {
            enabled: true,
            max_active,
            lease: Duration::from_millis(lease_ms),
            scan_interval: Duration::from_millis(100),
            poll: Duration::from_millis(20),
        }
    }

    fn host_on(store: &Store, id: &str, o: RunOptions) -> RunHost {
        RunHost::new(RunHosting {
            store: store.clone(),
            host_id: HostId::new(id).unwrap(),
            env: Arc::new(Echo),
            releases: Arc::new(AsResolved(Arc::new(Echo))),
            invoker: Arc::new(Echo),
            agents: None,
            options: o,
            metrics: None,
        })
    }

    async fn booted(store: &Store, id: &str, o: RunOptions) -> RunHost {
        let h = host_on(store, id, o);
        h.boot();
        while !h.ready() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        h
    }

    fn t(s: &str) -> TenantId {
        TenantId::new(s).unwrap()
    }

    async fn call<T: DeserializeOwned>(
        h: &RunHost,
        tenant: &str,
        method: &str,
        data: Value,
    ) -> Result<T, RunRefusal> {
        let raw = serde_json::value::RawValue::from_string(data.to_string()).unwrap();
        match h.handle(&t(tenant), method, Some(&raw)).await {
            ExtensionReply::Done(Ok(reply)) => {
                RunReply::<T>::decode(reply.get().as_bytes()).unwrap()
            }
            ExtensionReply::Done(Err(r)) => panic!("{method}: refused {r:?}"),
            ExtensionReply::NotFound => panic!("{method}: not served"),
        }
    }

    async fn start(h: &RunHost, program: &str) -> Result<RunStarted, RunRefusal> {
        call(
            h,
            "acme",
            "run.start",
            json!({"version": 1, "program": program}),
        )
        .await
    }

    async fn status(h: &RunHost, tenant: &str, run: &str) -> Result<RunView, RunRefusal> {
        call(
            h,
            tenant,
            "run.status",
            json!({"version": 1, "run_id": run}),
        )
        .await
    }

    async fn until(h: &RunHost, run: &str, what: impl Fn(&RunView) -> bool) -> RunView {
        for _ in 0..500 {
            let v = status(h, "acme", run).await.unwrap();
            if what(&v) {
                return v;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!(
            "run {run} never got there: {:?}",
            status(h, "acme", run).await
        );
    }

    fn parked(v: &RunView) -> bool {
        v.checkpoint.as_ref().is_some_and(|c| c.name == "approve")
    }

    async fn answer(
        h: &RunHost,
        tenant: &str,
        run: &str,
        value: Value,
    ) -> Result<RunAnswered, RunRefusal> {
        call(
            h,
            tenant,
            "run.answer",
            json!({"version": 1, "run_id": run, "checkpoint": "approve", "value": value}),
        )
        .await
    }

    pub async fn a_step_in_flight_at_the_stop_finishes_within_the_grace_and_no_new_step_begins(
        ts: &TestStore,
    ) {
        use std::sync::atomic::Ordering::SeqCst;
        let held = Arc::new(Held::default());
        let h = held_host(&ts.store, "host-a", &held);
        h.boot();
        while !h.ready() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let started = start(&h, TWO_STEPS).await.unwrap();
        while held.begun.load(SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        h.begin_stop();
        let refused = call::<RunStarted>(
            &h,
            "acme",
            "run.start",
            json!({"version": 1, "program": TWO_STEPS}),
        )
        .await
        .unwrap_err();
        assert_eq!(refused.code, "not_admitting");
        let now = tokio::time::Instant::now();
        let stopping = h.stop_by(now + Duration::from_secs(30), now + Duration::from_secs(31));
        let finishing = async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            held.finish.notify_one();
        };
        tokio::join!(stopping, finishing);
        assert!(
            now.elapsed() < Duration::from_secs(10),
            "the stop ended when the step did"
        );
        assert_eq!(held.begun.load(SeqCst), 1, "the second step never began");
        assert_eq!(held.cancelled.load(SeqCst), 0);
        let v = status(&h, "acme", &started.run_id).await.unwrap();
        assert_eq!(v.state, "running", "{v:?}");
        let steps: Vec<(&str, &str)> = v
            .journal
            .iter()
            .map(|e| (e.step.as_str(), e.entry.as_str()))
            .collect();
        assert_eq!(steps, [("first", "result")], "{v:?}");
    }

    pub async fn a_step_still_in_flight_at_the_grace_is_halted_and_nothing_is_recorded_for_it(
        ts: &TestStore,
    ) {
        use std::sync::atomic::Ordering::SeqCst;
        let held = Arc::new(Held::default());
        let h = held_host(&ts.store, "host-a", &held);
        h.boot();
        while !h.ready() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let started = start(&h, TWO_STEPS).await.unwrap();
        while held.begun.load(SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let now = tokio::time::Instant::now();
        h.stop_by(
            now + Duration::from_millis(300),
            now + Duration::from_secs(30),
        )
        .await;
        assert!(
            now.elapsed() >= Duration::from_millis(300),
            "halted at the grace, not before"
        );
        assert_eq!(held.cancelled.load(SeqCst), 1, "the call was cancelled");
        assert_eq!(h.driving(), 0);
        let v = status(&h, "acme", &started.run_id).await.unwrap();
        assert_eq!(v.state, "running", "left for a successor: {v:?}");
        assert!(v.journal.is_empty(), "nothing recorded: {v:?}");
    }

    pub async fn a_refused_program_reports_every_problem_and_records_nothing(ts: &TestStore) {
        let h = booted(&ts.store, "host-a", options(8, 5000)).await;
        let bad = "steps:\n  - name: a\n    invoke: nosuch@1.0.0\n  - name: a\n    sleep: 1s\n  - name: b\n    sleep: soon\n";
        let err = start(&h, bad).await.unwrap_err();
        assert_eq!(err.code, "invalid");
        let codes: Vec<&str> = err.problems.iter().map(|p| p.code.as_str()).collect();
        assert_eq!(
            codes,
            [
                "program.unknown_runnable",
                "program.duplicate_step",
                "program.duration"
            ]
        );
        assert!(ts.store.runs(&t("acme")).await.unwrap().is_empty());
    }

    pub async fn a_start_whose_run_cannot_be_made_durable_is_refused_and_no_run_appears_later(
        ts: &TestStore,
    ) {
        use sessionstore::testing::TestBackend;
        let h = booted(&ts.store, "host-a", options(8, 5000)).await;
        // The run's program cannot be written: its transaction fails after the status row.
        match ts.backend {
            TestBackend::Sqlite => {
                ts.exec_raw(
                    "CREATE TRIGGER refuse_programs BEFORE INSERT ON run_programs \
                     BEGIN SELECT RAISE(ABORT, 'programs refused'); END;",
                )
                .await
            }
            TestBackend::Postgres => {
                ts.exec_raw(
                    "CREATE FUNCTION refuse_programs() RETURNS trigger LANGUAGE plpgsql AS \
                     $$ BEGIN RAISE EXCEPTION 'programs refused'; END $$; \
                     CREATE TRIGGER refuse_programs BEFORE INSERT ON run_programs \
                     FOR EACH ROW EXECUTE FUNCTION refuse_programs();",
                )
                .await
            }
        }
        let refused = start(&h, QUICK).await.unwrap_err();
        assert!(
            !refused.message.contains("resume"),
            "nothing was recorded to resume: {refused:?}"
        );
        ts.exec_raw(match ts.backend {
            TestBackend::Sqlite => "DROP TRIGGER refuse_programs",
            TestBackend::Postgres => "DROP TRIGGER refuse_programs ON run_programs",
        })
        .await;
        // Several scans later nothing has appeared and nothing is driven.
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(ts.store.runs(&t("acme")).await.unwrap().is_empty());
        assert_eq!(h.driving(), 0);
        h.shutdown(Duration::from_secs(1)).await;
    }

    pub async fn an_answer_is_acknowledged_once_durable_while_nothing_consumes_it(ts: &TestStore) {
        let a = booted(&ts.store, "host-a", options(8, 5000)).await;
        let started = start(&a, PARKS).await.unwrap();
        until(&a, &started.run_id, |v| parked(v) && v.holder.is_empty()).await;
        a.shutdown(Duration::from_secs(5)).await;
        // A Host still booting drives no run, yet takes the answer and replies.
        let b = host_on(&ts.store, "host-b", options(8, 5000));
        b.delay_reconcile(Duration::from_secs(30));
        b.boot();
        let ok = tokio::time::timeout(
            Duration::from_secs(5),
            answer(&b, "acme", &started.run_id, json!(true)),
        )
        .await
        .expect("the reply did not wait for the run to take the answer")
        .unwrap();
        assert!(ok.recorded);
        // Durable when the reply came, and not consumed.
        let run = RunId::new(started.run_id.clone()).unwrap();
        let answers = ts.store.run_answers(&run).await.unwrap();
        assert_eq!(answers.len(), 1);
        assert!(answers[0].consumed_at_ms.is_none(), "{answers:?}");
        let v = status(&b, "acme", &started.run_id).await.unwrap();
        assert!(parked(&v), "{v:?}");
        assert_eq!(v.epoch, 1);
        b.shutdown(Duration::from_secs(1)).await;
    }

    pub async fn a_pause_free_run_completes_and_is_listed(ts: &TestStore) {
        let h = booted(&ts.store, "host-a", options(8, 5000)).await;
        let started = start(&h, QUICK).await.unwrap();
        assert_eq!((started.epoch, started.created), (1, true));
        let v = until(&h, &started.run_id, |v| v.state == "completed").await;
        assert_eq!(v.journal.len(), 2);
        assert!(v.holder.starts_with("host-a/"));
        let list: RunList = call(&h, "acme", "run.ps", json!({"version": 1}))
            .await
            .unwrap();
        assert_eq!(list.runs.len(), 1);
        assert_eq!(list.runs[0].state, "completed");
        let again = call::<RunStarted>(
            &h,
            "acme",
            "run.resume",
            json!({"version": 1, "run_id": started.run_id}),
        )
        .await
        .unwrap_err();
        assert_eq!(again.code, "state");
    }

    pub async fn run_list_answers_a_page_at_a_time_oldest_first_and_refuses_a_bad_page(
        ts: &TestStore,
    ) {
        let h = booted(&ts.store, "host-a", options(8, 5000)).await;
        let mut started = Vec::new();
        for _ in 0..3 {
            started.push(start(&h, QUICK).await.unwrap().run_id);
        }
        let first: RunList = call(&h, "acme", "run.list", json!({"version": 1, "limit": 2}))
            .await
            .unwrap();
        let next = first.next.clone().expect("a second page");
        let rest: RunList = call(
            &h,
            "acme",
            "run.list",
            json!({"version": 1, "limit": 2, "after": next}),
        )
        .await
        .unwrap();
        assert_eq!(rest.next, None);
        let listed: Vec<String> = first
            .runs
            .iter()
            .chain(&rest.runs)
            .map(|r| r.run_id.clone())
            .collect();
        assert_eq!(listed, started, "oldest first, each once");
        // Without a limit, one page holds them all.
        let all: RunList = call(&h, "acme", "run.list", json!({"version": 1}))
            .await
            .unwrap();
        assert_eq!((all.runs.len(), all.next), (3, None));
        let unknown = call::<RunList>(
            &h,
            "acme",
            "run.list",
            json!({"version": 1, "after": "run-nosuch"}),
        )
        .await
        .unwrap_err();
        assert_eq!(unknown.code, "not_found");
        // Another tenant's run is no cursor for this one.
        let foreign = call::<RunList>(
            &h,
            "globex",
            "run.list",
            json!({"version": 1, "after": started[0]}),
        )
        .await
        .unwrap_err();
        assert_eq!(foreign.code, "not_found");
        for bad in [json!(0), json!(501), json!(null), json!("2")] {
            let raw = serde_json::value::RawValue::from_string(
                json!({"version": 1, "limit": bad}).to_string(),
            )
            .unwrap();
            assert!(
                matches!(
                    h.handle(&t("acme"), "run.list", Some(&raw)).await,
                    ExtensionReply::Done(Err(Refusal::BadRequest))
                ),
                "limit {bad}"
            );
        }
    }

    pub async fn a_retried_start_with_its_key_returns_the_same_run(ts: &TestStore) {
        let h = booted(&ts.store, "host-a", options(8, 5000)).await;
        let data = json!({"version": 1, "program": QUICK, "idempotency_key": "k-1"});
        let a: RunStarted = call(&h, "acme", "run.start", data.clone()).await.unwrap();
        let b: RunStarted = call(&h, "acme", "run.start", data).await.unwrap();
        assert_eq!(a.run_id, b.run_id);
        assert!(a.created && !b.created);
        assert_eq!(ts.store.runs(&t("acme")).await.unwrap().len(), 1);
    }

    pub async fn another_tenants_run_reads_exactly_like_an_unknown_one(ts: &TestStore) {
        let h = booted(&ts.store, "host-a", options(8, 5000)).await;
        let started = start(&h, PARKS).await.unwrap();
        until(&h, &started.run_id, parked).await;
        let theirs = status(&h, "globex", &started.run_id).await.unwrap_err();
        let unknown = status(&h, "globex", "run-nosuch").await.unwrap_err();
        assert_eq!(theirs.code, "not_found");
        assert_eq!(
            theirs.message.replace(&started.run_id, "ID"),
            unknown.message.replace("run-nosuch", "ID")
        );
        let ans = answer(&h, "globex", &started.run_id, json!(true))
            .await
            .unwrap_err();
        assert_eq!(ans.code, "not_found");
        let resume = call::<RunStarted>(
            &h,
            "globex",
            "run.resume",
            json!({"version": 1, "run_id": started.run_id}),
        )
        .await
        .unwrap_err();
        assert_eq!(resume.code, "not_found");
        let list: RunList = call(&h, "globex", "run.list", json!({"version": 1}))
            .await
            .unwrap();
        assert!(list.runs.is_empty());
        assert!(
            ts.store
                .run_answers(&RunId::new(started.run_id).unwrap())
                .await
                .unwrap()
                .is_empty()
        );
    }

    pub async fn a_parked_run_takes_one_valid_answer_from_any_link_of_its_tenant(ts: &TestStore) {
        let h = booted(&ts.store, "host-a", options(8, 5000)).await;
        let started = start(&h, PARKS).await.unwrap();
        let v = until(&h, &started.run_id, parked).await;
        let cp = v.checkpoint.unwrap();
        assert_eq!(
            (cp.kind.as_str(), cp.question.as_deref()),
            ("ask", Some("ok?"))
        );
        let resume = call::<RunStarted>(
            &h,
            "acme",
            "run.resume",
            json!({"version": 1, "run_id": started.run_id}),
        )
        .await
        .unwrap_err();
        assert_eq!(resume.code, "conflict");
        let wrong = answer(&h, "acme", &started.run_id, json!("x"))
            .await
            .unwrap_err();
        assert_eq!(wrong.code, "invalid");
        let later = call::<RunAnswered>(
            &h,
            "acme",
            "run.answer",
            json!({"version": 1, "run_id": started.run_id, "checkpoint": "last", "value": 1}),
        )
        .await
        .unwrap_err();
        assert_eq!(later.code, "not_found");
        let ok = answer(&h, "acme", &started.run_id, json!(true))
            .await
            .unwrap();
        assert!(ok.recorded);
        assert_eq!(ok.answerer, "tenant:acme");
        let done = until(&h, &started.run_id, |v| v.state == "completed").await;
        // A link with an opaque token acts as its tenant: the start and the answer are its.
        assert_eq!(done.started_by.as_deref(), Some("tenant:acme"));
        assert_eq!(
            done.answers
                .iter()
                .map(|a| (a.checkpoint.as_str(), a.answerer.as_str()))
                .collect::<Vec<_>>(),
            [("approve", "tenant:acme")]
        );
        // Parked with no driver, then taken over when the answer made it due.
        assert_eq!(done.epoch, 2);
        let last = done.journal.iter().find(|e| e.step == "last").unwrap();
        assert_eq!(last.body, json!({"output": {"ok": true}}));
        let after = answer(&h, "acme", &started.run_id, json!(false))
            .await
            .unwrap_err();
        assert_eq!(after.code, "state");
    }

    pub async fn start_and_resume_answer_unavailable_until_the_boot_reconcile_returns(
        ts: &TestStore,
    ) {
        let h = host_on(&ts.store, "host-a", options(8, 5000));
        h.delay_reconcile(Duration::from_millis(400));
        h.boot();
        let early = start(&h, QUICK).await.unwrap_err();
        assert_eq!(early.code, "unavailable");
        // A run recorded elsewhere, held by a live holder: resuming it waits for the gate.
        ts.store
            .create_run(NewRun {
                run_id: RunId::new("run-x").unwrap(),
                tenant: t("acme"),
                source: PARKS.into(),
                input: "{}".into(),
                holder: "host-b/1".into(),
                fencing_token: "b1".into(),
                lease: Duration::from_secs(60),
                idempotency_key: None,
                pins: Vec::new(),
                started_by: None,
                trace: None,
            })
            .await
            .unwrap();
        let resume = call::<RunStarted>(
            &h,
            "acme",
            "run.resume",
            json!({"version": 1, "run_id": "run-x"}),
        )
        .await
        .unwrap_err();
        assert_eq!(resume.code, "unavailable");
        assert!(
            resume.message.contains("hostd run resume run-x"),
            "{}",
            resume.message
        );
        let list: RunList = call(&h, "acme", "run.list", json!({"version": 1}))
            .await
            .unwrap();
        assert_eq!(
            list.runs
                .iter()
                .map(|r| r.run_id.as_str())
                .collect::<Vec<_>>(),
            ["run-x"],
            "reads are served during the reconcile"
        );
        while !h.ready() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        start(&h, QUICK).await.unwrap();
    }

    /// A refusal may tell the user to resume a run only when that run was recorded: a start
    /// refused at the cap, or a resume of an unknown id while the Host boots, names no id.
    pub async fn a_refusal_hints_at_resuming_only_a_run_that_was_recorded(ts: &TestStore) {
        let booting = host_on(&ts.store, "host-b", options(8, 5000));
        booting.delay_reconcile(Duration::from_secs(30));
        booting.boot();
        let unknown = call::<RunStarted>(
            &booting,
            "acme",
            "run.resume",
            json!({"version": 1, "run_id": "run-never-recorded"}),
        )
        .await
        .unwrap_err();
        assert_eq!(unknown.code, "not_found", "{}", unknown.message);
        assert!(
            !unknown.message.contains("hostd run resume"),
            "{}",
            unknown.message
        );
        booting.shutdown(Duration::from_secs(1)).await;

        let h = booted(&ts.store, "host-a", options(1, 5000)).await;
        start(&h, HOLDS).await.unwrap();
        let refused = start(&h, QUICK).await.unwrap_err();
        assert_eq!(refused.code, "resource_exhausted");
        assert!(
            !refused.message.contains("resume"),
            "a start refused before anything was recorded names no run to resume: {}",
            refused.message
        );
        let runs = ts.store.runs(&t("acme")).await.unwrap();
        assert_eq!(runs.len(), 1, "the refused start recorded nothing");
        for r in &runs {
            assert!(
                !refused.message.contains(r.run_id.as_str()),
                "{}",
                refused.message
            );
        }
    }

    pub async fn past_the_admission_cap_a_launch_is_refused_and_claims_nothing(ts: &TestStore) {
        let h = booted(&ts.store, "host-a", options(2, 5000)).await;
        let a = start(&h, HOLDS).await.unwrap();
        start(&h, HOLDS).await.unwrap();
        for _ in 0..2 {
            let refused = start(&h, QUICK).await.unwrap_err();
            assert_eq!(refused.code, "resource_exhausted");
        }
        assert_eq!(ts.store.runs(&t("acme")).await.unwrap().len(), 2);
        assert_eq!(h.driving(), 2);
        until(&h, &a.run_id, |v| v.state == "completed").await;
        for _ in 0..100 {
            if h.driving() < 2 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        start(&h, QUICK).await.unwrap();
    }

    pub async fn parked_runs_hold_no_slot_and_a_new_run_starts_at_the_cap(ts: &TestStore) {
        let h = booted(&ts.store, "host-a", options(2, 5000)).await;
        let mut asks = Vec::new();
        for _ in 0..6 {
            let r = start(&h, PARKS).await.unwrap();
            until(&h, &r.run_id, parked).await;
            asks.push(r);
        }
        let nap = start(&h, NAPS).await.unwrap();
        until(&h, &nap.run_id, |v| {
            v.checkpoint.as_ref().is_some_and(|c| c.name == "nap")
        })
        .await;
        for _ in 0..200 {
            if h.driving() == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(h.driving(), 0, "a parked run holds no slot");
        // Seven runs wait; a cap of two still admits new work at once.
        let quick = start(&h, QUICK).await.unwrap();
        until(&h, &quick.run_id, |v| v.state == "completed").await;
        ts.advance(Duration::from_millis(700)).await;
        let slept = until(&h, &nap.run_id, |v| v.state == "completed").await;
        assert_eq!(slept.epoch, 2, "the sleep's deadline woke it: {slept:?}");
        for r in &asks {
            answer(&h, "acme", &r.run_id, json!(true)).await.unwrap();
        }
        for r in &asks {
            let done = until(&h, &r.run_id, |v| v.state == "completed").await;
            assert_eq!(done.epoch, 2);
        }
    }

    pub async fn an_answer_given_on_another_host_wakes_a_parked_run(ts: &TestStore) {
        let a = booted(&ts.store, "host-a", options(8, 5000)).await;
        let b = booted(&ts.store, "host-b", options(8, 5000)).await;
        let started = start(&a, PARKS).await.unwrap();
        // Armed first, then parked: a parked run names no holder.
        until(&a, &started.run_id, |v| parked(v) && v.holder.is_empty()).await;
        answer(&b, "acme", &started.run_id, json!(true))
            .await
            .unwrap();
        let done = until(&a, &started.run_id, |v| v.state == "completed").await;
        assert_eq!(done.epoch, 2);
        assert!(done.holder.starts_with("host-"), "{done:?}");
    }

    pub async fn a_restarted_host_leaves_a_parked_run_parked_until_its_answer(ts: &TestStore) {
        let h = booted(&ts.store, "host-a", options(8, 5000)).await;
        let parked_run = start(&h, PARKS).await.unwrap();
        let done_run = start(&h, QUICK).await.unwrap();
        until(&h, &parked_run.run_id, |v| parked(v) && v.holder.is_empty()).await;
        let done = until(&h, &done_run.run_id, |v| v.state == "completed").await;
        h.shutdown(Duration::from_secs(5)).await;
        let still = status(&h, "acme", &parked_run.run_id).await.unwrap();
        assert_eq!((still.state.as_str(), still.epoch), ("running", 1));
        let again = booted(&ts.store, "host-a", options(8, 5000)).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let v = status(&again, "acme", &parked_run.run_id).await.unwrap();
        assert_eq!(
            (v.epoch, v.holder.as_str()),
            (1, ""),
            "nothing drives a parked run"
        );
        assert!(parked(&v));
        let kept = status(&again, "acme", &done_run.run_id).await.unwrap();
        assert_eq!((kept.epoch, kept.holder), (done.epoch, done.holder));
        answer(&again, "acme", &parked_run.run_id, json!(true))
            .await
            .unwrap();
        let end = until(&again, &parked_run.run_id, |v| v.state == "completed").await;
        assert_eq!(end.epoch, 2);
    }

    /// Records a run as a Host that died while driving it left it: `running`, held by
    /// `holder` under epoch 1, with a lease of `lease`.
    async fn left_driven(ts: &TestStore, run: &str, holder: &str, lease: Duration) {
        ts.store
            .create_run(NewRun {
                run_id: RunId::new(run).unwrap(),
                tenant: t("acme"),
                source: QUICK.into(),
                input: "{}".into(),
                holder: holder.into(),
                fencing_token: "old".into(),
                lease,
                idempotency_key: None,
                pins: Vec::new(),
                started_by: None,
                trace: None,
            })
            .await
            .unwrap();
    }

    pub async fn a_restarted_host_takes_back_its_driven_run_under_the_next_epoch(ts: &TestStore) {
        left_driven(ts, "run-left", "host-a/old", Duration::from_secs(60)).await;
        let again = booted(&ts.store, "host-a", options(8, 5000)).await;
        let v = until(&again, "run-left", |v| v.state == "completed").await;
        assert_eq!(v.epoch, 2);
        assert!(
            v.holder.starts_with("host-a/") && v.holder != "host-a/old",
            "{v:?}"
        );
    }

    pub async fn a_live_host_takes_over_a_run_whose_holder_stopped_renewing(ts: &TestStore) {
        left_driven(ts, "run-left", "host-a/old", Duration::from_millis(1500)).await;
        let b = booted(&ts.store, "host-b", options(8, 400)).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let held = status(&b, "acme", "run-left").await.unwrap();
        assert_eq!(held.epoch, 1, "a live lease is not taken");
        // The holder stopped renewing; its lease runs out.
        ts.advance(Duration::from_millis(1500)).await;
        let v = until(&b, "run-left", |v| v.state == "completed").await;
        assert_eq!(v.epoch, 2);
        assert!(v.holder.starts_with("host-b/"), "{v:?}");
    }

    pub async fn parallel_resumes_of_an_unheld_run_let_exactly_one_proceed(ts: &TestStore) {
        let mut o = options(100, 5000);
        o.scan_interval = Duration::from_secs(20);
        // Booted first, so neither its reconcile nor its scan sees the orphan.
        let h = booted(&ts.store, "host-a", o).await;
        let target = "run-orphan".to_owned();
        ts.store
            .create_run(NewRun {
                run_id: RunId::new(target.clone()).unwrap(),
                tenant: t("acme"),
                source: PARKS.into(),
                input: "{}".into(),
                holder: "gone-host/1".into(),
                fencing_token: "old".into(),
                lease: Duration::from_millis(300),
                idempotency_key: None,
                pins: Vec::new(),
                started_by: None,
                trace: None,
            })
            .await
            .unwrap();
        ts.advance(Duration::from_millis(600)).await;
        let mut calls = Vec::new();
        for _ in 0..50 {
            let h = h.clone();
            let target = target.clone();
            calls.push(tokio::spawn(async move {
                call::<RunStarted>(
                    &h,
                    "acme",
                    "run.resume",
                    json!({"version": 1, "run_id": target}),
                )
                .await
            }));
        }
        let mut ok = 0;
        for c in calls {
            match c.await.unwrap() {
                Ok(s) => {
                    ok += 1;
                    assert_eq!(s.epoch, 2);
                }
                Err(r) => assert_eq!(r.code, "conflict", "{r:?}"),
            }
        }
        assert_eq!(ok, 1);
        let s = ts
            .store
            .run_status(None, &RunId::new(target).unwrap())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(s.epoch, 2);
    }

    pub async fn a_run_without_a_recorded_program_is_left_and_the_gate_still_opens(ts: &TestStore) {
        ts.exec_raw(
            "INSERT INTO run_status (run_id, tenant_id, state, holder, epoch, fencing_token, lease_expires_at, input, revision, created_at, updated_at) \
             VALUES ('run-bare', 'acme', 'running', 'host-a/1', 1, 'tok', 0, '{}', 1, 0, 0)",
        )
        .await;
        let h = booted(&ts.store, "host-a", options(8, 5000)).await;
        start(&h, QUICK).await.unwrap();
        let s = ts
            .store
            .run_status(None, &RunId::new("run-bare").unwrap())
            .await
            .unwrap()
            .unwrap();
        assert_eq!((s.epoch, s.holder.as_str()), (1, "host-a/1"));
        let resume = call::<RunStarted>(
            &h,
            "acme",
            "run.resume",
            json!({"version": 1, "run_id": "run-bare"}),
        )
        .await
        .unwrap_err();
        assert_eq!(resume.code, "program_missing");
    }

    /// Once the Host drains, `run.start` and `run.resume` answer `not_admitting` and claim
    /// nothing: no run is recorded and a parked run keeps its epoch for another Host.
    pub async fn start_and_resume_during_a_drain_answer_not_admitting_and_claim_nothing(
        ts: &TestStore,
    ) {
        let h = booted(&ts.store, "host-a", options(8, 5000)).await;
        let started = start(&h, PARKS).await.unwrap();
        until(&h, &started.run_id, parked).await;
        h.shutdown(Duration::from_secs(5)).await;
        let refused = start(&h, QUICK).await.unwrap_err();
        assert_eq!(refused.code, "not_admitting", "{}", refused.message);
        let resume = call::<RunStarted>(
            &h,
            "acme",
            "run.resume",
            json!({"version": 1, "run_id": started.run_id}),
        )
        .await
        .unwrap_err();
        assert_eq!(resume.code, "not_admitting", "{}", resume.message);
        let list: RunList = call(&h, "acme", "run.list", json!({"version": 1}))
            .await
            .unwrap();
        assert_eq!(list.runs.len(), 1, "the refused start recorded a run");
        assert_eq!(list.runs[0].epoch, 1, "the refused resume claimed the run");
    }

    pub async fn cancel_ends_a_parked_run_and_stops_its_driver(ts: &TestStore) {
        let h = booted(&ts.store, "host-a", options(8, 5000)).await;
        let started = start(&h, PARKS).await.unwrap();
        until(&h, &started.run_id, parked).await;
        let v: RunView = call(
            &h,
            "acme",
            "run.cancel",
            json!({"version": 1, "run_id": started.run_id}),
        )
        .await
        .unwrap();
        assert_eq!(v.state, "cancelled");
        for _ in 0..200 {
            if h.driving() == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(h.driving(), 0);
    }
}

sessionstore::both_backends!(cases =>
    a_step_in_flight_at_the_stop_finishes_within_the_grace_and_no_new_step_begins,
    a_step_still_in_flight_at_the_grace_is_halted_and_nothing_is_recorded_for_it,
    a_refused_program_reports_every_problem_and_records_nothing,
    a_pause_free_run_completes_and_is_listed,
    run_list_answers_a_page_at_a_time_oldest_first_and_refuses_a_bad_page,
    a_start_whose_run_cannot_be_made_durable_is_refused_and_no_run_appears_later,
    an_answer_is_acknowledged_once_durable_while_nothing_consumes_it,
    a_retried_start_with_its_key_returns_the_same_run,
    another_tenants_run_reads_exactly_like_an_unknown_one,
    a_parked_run_takes_one_valid_answer_from_any_link_of_its_tenant,
    start_and_resume_answer_unavailable_until_the_boot_reconcile_returns,
    past_the_admission_cap_a_launch_is_refused_and_claims_nothing,
    a_refusal_hints_at_resuming_only_a_run_that_was_recorded,
    parked_runs_hold_no_slot_and_a_new_run_starts_at_the_cap,
    an_answer_given_on_another_host_wakes_a_parked_run,
    a_restarted_host_leaves_a_parked_run_parked_until_its_answer,
    a_restarted_host_takes_back_its_driven_run_under_the_next_epoch,
    a_live_host_takes_over_a_run_whose_holder_stopped_renewing,
    parallel_resumes_of_an_unheld_run_let_exactly_one_proceed,
    a_run_without_a_recorded_program_is_left_and_the_gate_still_opens,
    cancel_ends_a_parked_run_and_stops_its_driver,
    start_and_resume_during_a_drain_answer_not_admitting_and_claim_nothing,
);
