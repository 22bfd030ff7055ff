//! Agent steps of workflow runs on a composed Host with the real harness (SQLite and
//! PostgreSQL): the step is one turn in a fresh session through the Host's exactly-once
//! command path, its reply is the step's output, and a driver that stops mid-step (after
//! admitting the prompt, or after the turn ended but before its result was journaled) replays
//! onto the same session and command instead of asking the agent a second time.

mod cases {
    use std::collections::BTreeSet;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use async_trait::async_trait;
    use host::Service;
    use hostlink::runs::{RunReply, RunStarted, RunView};
    use hostlink_server::backend::ExtensionReply;
    use run_hosting::agents::{ServiceAgents, TurnIds};
    use run_hosting::hosting::{RunHost, RunHosting, RunOptions};
    use serde_json::{Value, json};
    use sessionstore::testing::TestStore;
    use sessionstore::*;
    use workflow::{AgentTurn, AgentTurns, StoreReleases, WorkspaceRunnables};

    use testkit::*;

    const PROGRAM: &str = "steps:\n  - name: greet\n    agent: assistant\n    prompt: \"hello ${input.name}\"\n  - name: nap\n    sleep: 0s\n";

    /// How a driver's agent turns end in these cases.
    #[derive(Clone, Copy, PartialEq, Eq)]
    enum Crash {
        /// Never: every turn runs to its reply.
        Never,
        /// The prompt is admitted, then the driver hangs (its turn future is dropped).
        AfterAdmission,
        /// The turn runs to its reply, then the driver hangs before the result is journaled.
        AfterReply,
    }

    struct Turns {
        inner: ServiceAgents,
        store: Store,
        crash: Crash,
        calls: AtomicUsize,
    }

    #[async_trait]
    impl AgentTurns for Turns {
        async fn turn(&self, turn: AgentTurn) -> Result<String, String> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            match self.crash {
                Crash::Never => self.inner.turn(turn).await,
                Crash::AfterReply => {
                    let _ = self.inner.turn(turn).await;
                    std::future::pending().await
                }
                Crash::AfterAdmission => {
                    let ids = TurnIds::of(&turn)?;
                    let tenant = TenantId::new(turn.tenant.clone()).unwrap();
                    let admitted = async {
                        loop {
                            if self
                                .store
                                .command(&tenant, &ids.session, &ids.command)
                                .await
                                .is_ok()
                            {
                                return;
                            }
                            tokio::time::sleep(Duration::from_millis(1)).await;
                        }
                    };
                    tokio::select! {
                        _ = self.inner.turn(turn) => {}
                        _ = admitted => {}
                    }
                    std::future::pending().await
                }
            }
        }
    }

    fn run_host(svc: &Service, crash: Crash) -> (RunHost, Arc<Turns>) {
        let inner = ServiceAgents::new(svc.clone());
        let env = Arc::new(WorkspaceRunnables {
            runner: None,
            agents: inner.agents().into_iter().collect::<BTreeSet<_>>(),
        });
        let turns = Arc::new(Turns {
            inner,
            store: svc.store().clone(),
            crash,
            calls: AtomicUsize::new(0),
        });
        // Programs here invoke no runnable: nothing is pinned, and no release is ever run.
        let releases = Arc::new(StoreReleases::new(
            svc.store().clone(),
            None,
            &std::env::temp_dir().join("runs-agents-unused"),
        ));
        let h = RunHost::new(RunHosting {
            store: svc.store().clone(),
            host_id: svc.config().host_id.clone(),
            env,
            releases: releases.clone(),
            invoker: releases,
            agents: Some(turns.clone()),
            options: RunOptions {
                enabled: true,
                max_active: 8,
                lease: Duration::from_millis(600),
                scan_interval: Duration::from_millis(100),
                poll: Duration::from_millis(20),
            },
            metrics: None,
        });
        (h, turns)
    }

    async fn booted(svc: &Service, crash: Crash) -> (RunHost, Arc<Turns>) {
        let (h, turns) = run_host(svc, crash);
        h.boot();
        eventually("the run reconcile", async || {
            check(h.ready(), || "not ready".into())
        })
        .await;
        (h, turns)
    }

    async fn call<T: serde::de::DeserializeOwned>(h: &RunHost, method: &str, data: Value) -> T {
        let raw = serde_json::value::RawValue::from_string(data.to_string()).unwrap();
        match h
            .handle(&TenantId::new("acme").unwrap(), method, Some(&raw))
            .await
        {
            ExtensionReply::Done(Ok(reply)) => RunReply::<T>::decode(reply.get().as_bytes())
                .unwrap()
                .unwrap_or_else(|r| panic!("{method} refused: {r:?}")),
            ExtensionReply::Done(Err(r)) => panic!("{method}: refused {r:?}"),
            ExtensionReply::NotFound => panic!("{method}: not served"),
        }
    }

    async fn start(h: &RunHost) -> String {
        let s: RunStarted = call(
            h,
            "run.start",
            json!({"version": 1, "program": PROGRAM, "input": {"name": "ada"}}),
        )
        .await;
        s.run_id
    }

    async fn completed(h: &RunHost, run: &str) -> RunView {
        eventually("the run to complete", async || {
            let v: RunView = call(h, "run.status", json!({"version": 1, "run_id": run})).await;
            check(v.state == "completed", || format!("{v:?}"))?;
            Ok(v)
        })
        .await
    }

    /// The step's session and command, and the checks that its turn ran exactly once.
    async fn one_turn(store: &Store, run: &str) -> SessionRecord {
        let tenant = TenantId::new("acme").unwrap();
        let ids = TurnIds::of(&AgentTurn {
            tenant: "acme".into(),
            run_id: run.into(),
            step: "greet".into(),
            agent: "assistant".into(),
            prompt: String::new(),
            attempt: 1,
            idempotency_key: format!("run-{run}-greet-1"),
        })
        .unwrap();
        let s = store.session(&tenant, &ids.session).await.unwrap();
        let commands = store
            .list_commands(&tenant, &s.session, 0, 100)
            .await
            .unwrap();
        assert_eq!(
            commands
                .iter()
                .map(|c| c.command.clone())
                .collect::<Vec<_>>(),
            vec![ids.command.clone()],
            "the step admitted exactly one command"
        );
        assert_eq!(commands[0].outcome, Some(Outcome::Applied));
        let page = store
            .journal_public_page(&tenant, s.binding.runtime_session_id, 0, None, 1000)
            .await
            .unwrap();
        let types: Vec<String> = page
            .events
            .iter()
            .map(|e| {
                serde_json::from_slice::<Value>(&e.body).unwrap()["type"]
                    .as_str()
                    .unwrap()
                    .to_owned()
            })
            .collect();
        assert_eq!(
            types.iter().filter(|t| *t == "turn_started").count(),
            1,
            "exactly one turn: {types:?}"
        );
        assert_eq!(types.iter().filter(|t| *t == "user_message").count(), 1);
        check_exactly_once(store, &s).await;
        s
    }

    fn greet_output(v: &RunView) -> Value {
        let results: Vec<&Value> = v
            .journal
            .iter()
            .filter(|e| e.step == "greet" && e.entry == "result")
            .map(|e| &e.body)
            .collect();
        assert_eq!(results.len(), 1, "one result for the agent step: {v:?}");
        results[0]["output"].clone()
    }

    pub async fn an_agent_step_is_one_turn_in_a_fresh_session_and_its_reply_is_the_output(
        ts: &TestStore,
    ) {
        let (svc, _) = started(ts, options("h-agent-step")).await;
        let (h, turns) = booted(&svc, Crash::Never).await;
        let run = start(&h).await;
        let v = completed(&h, &run).await;
        assert_eq!(greet_output(&v), json!("You said: hello ada"));
        assert_eq!(turns.calls.load(Ordering::SeqCst), 1);
        one_turn(svc.store(), &run).await;
        h.shutdown(Duration::from_secs(5)).await;
        svc.stop().await;
    }

    pub async fn a_step_whose_session_no_host_can_take_fails_at_the_prompts_deadline(
        ts: &TestStore,
    ) {
        let mut o = options("h-agent-full");
        o.capacity = 1;
        let (svc, _) = started(ts, o).await;
        // The Host's only slot is taken by another session.
        let c = Controller::new(ts);
        let other = c.session().await;
        c.attach(&svc, &other).await;
        let mut agents = ServiceAgents::new(svc.clone());
        agents.apply_within = Duration::from_millis(300);
        agents.poll = Duration::from_millis(20);
        let turn = AgentTurn {
            tenant: "acme".into(),
            run_id: "run-full".into(),
            step: "greet".into(),
            agent: "assistant".into(),
            prompt: "hello".into(),
            attempt: 1,
            idempotency_key: "run-run-full-greet-1".into(),
        };
        let turning = tokio::spawn(async move { agents.turn(turn).await });
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            !turning.is_finished(),
            "it waits while the deadline has not passed"
        );
        // The store's clock decides the deadline (a test store's clock moves when told).
        ts.advance(Duration::from_secs(1)).await;
        let ended = tokio::time::timeout(Duration::from_secs(10), turning)
            .await
            .expect("the attempt ends in bounded time")
            .unwrap();
        let why = ended.expect_err("no Host could take the session");
        assert!(why.contains("deadline"), "{why}");
        svc.stop().await;
    }

    async fn replays_after(ts: &TestStore, host: &str, crash: Crash) {
        let (svc, _) = started(ts, options(host)).await;
        let (first, crashing) = booted(&svc, crash).await;
        let run = start(&first).await;
        let tenant = TenantId::new("acme").unwrap();
        let session = SessionId::new(format!("run-{run}-greet-1")).unwrap();
        let command = CommandId::new(format!("run-{run}-greet-1.prompt")).unwrap();
        // Wait for the point the crash stands for.
        eventually("the crash point", async || {
            let rec = svc.store().command(&tenant, &session, &command).await;
            match (crash, rec) {
                (Crash::AfterAdmission, Ok(_)) => Ok(()),
                (Crash::AfterReply, Ok(c)) if c.state.is_terminal() => {
                    let s = svc.store().session(&tenant, &session).await.unwrap();
                    let page = svc
                        .store()
                        .journal_public_page(&tenant, s.binding.runtime_session_id, 0, None, 1000)
                        .await
                        .unwrap();
                    let done = page.events.iter().any(|e| {
                        serde_json::from_slice::<Value>(&e.body).unwrap()["type"] == "turn_done"
                    });
                    check(done, || "the turn has not ended".into())
                }
                (_, r) => Err(format!("{r:?}")),
            }
        })
        .await;
        assert_eq!(crashing.calls.load(Ordering::SeqCst), 1);
        let before: RunView =
            call(&first, "run.status", json!({"version": 1, "run_id": run})).await;
        assert!(
            !before
                .journal
                .iter()
                .any(|e| e.step == "greet" && e.entry == "result"),
            "the crash came before the step's result was journaled"
        );
        // The driver stops crash-equivalently: nothing more is written.
        first.shutdown(Duration::from_secs(5)).await;
        let (second, turns) = booted(&svc, Crash::Never).await;
        let v = completed(&second, &run).await;
        assert_eq!(v.epoch, before.epoch + 1, "taken back under the next epoch");
        assert_eq!(greet_output(&v), json!("You said: hello ada"));
        assert_eq!(
            turns.calls.load(Ordering::SeqCst),
            1,
            "the replay asked once"
        );
        one_turn(svc.store(), &run).await;
        second.shutdown(Duration::from_secs(5)).await;
        svc.stop().await;
    }

    pub async fn a_driver_stopped_after_admitting_the_prompt_replays_onto_the_same_command(
        ts: &TestStore,
    ) {
        replays_after(ts, "h-agent-admitted", Crash::AfterAdmission).await;
    }

    pub async fn a_driver_stopped_after_the_reply_takes_the_settled_reply_without_a_second_turn(
        ts: &TestStore,
    ) {
        replays_after(ts, "h-agent-replied", Crash::AfterReply).await;
    }
}

sessionstore::both_backends!(cases =>
    an_agent_step_is_one_turn_in_a_fresh_session_and_its_reply_is_the_output,
    a_driver_stopped_after_admitting_the_prompt_replays_onto_the_same_command,
    a_driver_stopped_after_the_reply_takes_the_settled_reply_without_a_second_turn,
    a_step_whose_session_no_host_can_take_fails_at_the_prompts_deadline,
);
