//! A session's conversation stays acceptable to a strict OpenAI-compatible API however its
//! turns end: every case runs the harness over a real store (SQLite and PostgreSQL) against a
//! local server that refuses any request whose history breaks the API's rules (see
//! `support::strict_chat`), then sends one more message that must be answered.

mod support;

mod cases {
    use std::sync::Arc;
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    use department::{LaunchMode, RuntimeCommand};
    use harness::events::{Cause, HarnessEvent};
    use harness::model::ToolCall;
    use harness::{AgentConfig, SessionHandle};
    use serde_json::json;
    use sessionstore::testing::TestStore;
    use sessionstore::wire::CommandBodyV1;
    use sessionstore::*;

    use super::support::strict_chat::StrictChat;
    use super::support::*;

    async fn strict(
        ts: &TestStore,
        server: &StrictChat,
        adjust: impl FnOnce(&mut AgentConfig),
    ) -> Fx {
        let model = Arc::new(server.model());
        Fx::with_store(ts.store.clone(), ts, |a| {
            a.model = model;
            adjust(a);
        })
        .await
    }

    /// The tool results the journal holds, as (call id, content, is_error).
    fn results(evs: &[HarnessEvent]) -> Vec<(String, String, bool)> {
        evs.iter()
            .filter_map(|e| match e {
                HarnessEvent::ToolResult {
                    call_id,
                    content,
                    is_error,
                    ..
                } => Some((call_id.clone(), content.clone(), *is_error)),
                _ => None,
            })
            .collect()
    }

    /// The ids of every tool call the model made.
    fn calls(evs: &[HarnessEvent]) -> Vec<String> {
        evs.iter()
            .flat_map(|e| match e {
                HarnessEvent::AssistantMessage { tool_calls, .. } => {
                    tool_calls.iter().map(|c| c.id.clone()).collect()
                }
                _ => Vec::new(),
            })
            .collect()
    }

    fn last_end(evs: &[HarnessEvent]) -> Option<&HarnessEvent> {
        evs.iter().rev().find(|e| e.is_turn_terminal())
    }

    /// One more message is answered by the strict server, which refused nothing so far, and
    /// every call the journal holds has exactly one result.
    async fn the_next_message_is_answered(fx: &Fx, h: &SessionHandle, server: &StrictChat) {
        let rec = fx.ok(h, input("and now?")).await;
        assert_eq!(rec.outcome, Some(Outcome::Applied));
        idle(h).await;
        let evs = fx.events().await;
        assert!(
            matches!(last_end(&evs), Some(HarnessEvent::TurnDone { .. })),
            "the last turn ended {:?}; refusals: {:?}",
            last_end(&evs),
            server.refusals()
        );
        assert_eq!(
            replies(&evs).last().map(String::as_str),
            Some("ok: and now?")
        );
        assert_eq!(server.refusals(), Vec::<String>::new());
        let mut answered: Vec<String> = results(&evs).into_iter().map(|r| r.0).collect();
        let mut made = calls(&evs);
        answered.sort();
        made.sort();
        assert_eq!(
            answered, made,
            "every call has exactly one journaled result"
        );
    }

    pub async fn after_an_interrupt_at_a_permission_gate_the_call_is_answered_and_the_next_message_succeeds(
        ts: &TestStore,
    ) {
        let server = StrictChat::start().await;
        let fx = strict(ts, &server, |_| {}).await;
        let h = fx.launch(LaunchMode::Create).await;
        fx.ok(&h, input("call launch_rocket {}")).await;
        fx.open_gate().await;
        let rec = fx.ok(&h, CommandBodyV1::Interrupt).await;
        assert_eq!(rec.outcome, Some(Outcome::Applied));
        idle(&h).await;
        let evs = fx.events().await;
        let [(_, content, true)] = &results(&evs)[..] else {
            panic!("one error result: {evs:#?}")
        };
        assert!(content.contains("waited for approval"), "{content}");
        assert_eq!(fx.counter.runs.load(Ordering::SeqCst), 0);
        the_next_message_is_answered(&fx, &h, &server).await;
    }

    pub async fn after_an_interrupt_at_an_ask_user_gate_the_question_is_answered_and_the_next_message_succeeds(
        ts: &TestStore,
    ) {
        let server = StrictChat::start().await;
        let fx = strict(ts, &server, |_| {}).await;
        let h = fx.launch(LaunchMode::Create).await;
        fx.ok(&h, input(r#"call ask_user {"question":"Which colour?"}"#))
            .await;
        fx.open_gate().await;
        fx.ok(&h, CommandBodyV1::Interrupt).await;
        idle(&h).await;
        let evs = fx.events().await;
        let [(_, content, true)] = &results(&evs)[..] else {
            panic!("one error result: {evs:#?}")
        };
        assert!(content.contains("Not answered"), "{content}");
        the_next_message_is_answered(&fx, &h, &server).await;
    }

    pub async fn an_interrupt_between_calls_of_one_step_answers_each_by_how_far_it_got(
        ts: &TestStore,
    ) {
        let server = StrictChat::start().await;
        let fx = strict(ts, &server, |_| {}).await;
        let h = fx.launch(LaunchMode::Create).await;
        fx.ok(
            &h,
            input(r#"call echo {"text":"first"} also call launch_rocket {} also call echo {"text":"third"}"#),
        )
        .await;
        fx.open_gate().await;
        fx.ok(&h, CommandBodyV1::Interrupt).await;
        idle(&h).await;
        let evs = fx.events().await;
        let got = results(&evs);
        assert_eq!(got.len(), 3, "{evs:#?}");
        assert_eq!((got[0].1.as_str(), got[0].2), ("first", false));
        assert!(
            got[1].2 && got[1].1.contains("waited for approval"),
            "{got:?}"
        );
        assert!(
            got[2].2 && got[2].1.contains("before this call started"),
            "{got:?}"
        );
        assert_eq!(fx.counter.runs.load(Ordering::SeqCst), 0);
        the_next_message_is_answered(&fx, &h, &server).await;
    }

    pub async fn an_interrupt_while_a_tool_runs_answers_that_it_may_have_taken_effect(
        ts: &TestStore,
    ) {
        let server = StrictChat::start().await;
        let fx = strict(ts, &server, |_| {}).await;
        let h = fx.launch(LaunchMode::Create).await;
        fx.ok(&h, input("call slow_effect {}")).await;
        let deadline = tokio::time::Instant::now() + WAIT;
        while fx.blocker.started.load(Ordering::SeqCst) == 0 {
            assert!(tokio::time::Instant::now() < deadline, "the tool never ran");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        fx.ok(&h, CommandBodyV1::Interrupt).await;
        idle(&h).await;
        let evs = fx.events().await;
        let [(_, content, true)] = &results(&evs)[..] else {
            panic!("one error result: {evs:#?}")
        };
        assert!(
            content.contains("may have partly taken effect"),
            "{content}"
        );
        the_next_message_is_answered(&fx, &h, &server).await;
    }

    pub async fn an_interrupt_at_a_gate_restored_open_answers_its_call(ts: &TestStore) {
        let server = StrictChat::start().await;
        let fx = strict(ts, &server, |_| {}).await;
        let h = fx.launch(LaunchMode::Create).await;
        fx.ok(&h, input(r#"call ask_user {"question":"Which city?"}"#))
            .await;
        fx.open_gate().await;
        h.abandon().await.unwrap();
        let restored = fx.launch(LaunchMode::Restore).await;
        fx.ok(&restored, CommandBodyV1::Interrupt).await;
        idle(&restored).await;
        let evs = fx.events().await;
        let [(_, content, true)] = &results(&evs)[..] else {
            panic!("one error result: {evs:#?}")
        };
        assert!(content.contains("Not answered"), "{content}");
        the_next_message_is_answered(&fx, &restored, &server).await;
    }

    pub async fn a_denied_call_is_answered_and_the_model_continues(ts: &TestStore) {
        let server = StrictChat::start().await;
        let fx = strict(ts, &server, |_| {}).await;
        let h = fx.launch(LaunchMode::Create).await;
        fx.ok(&h, input("call launch_rocket {}")).await;
        let gate = fx.open_gate().await;
        fx.ok(&h, answer(gate, "deny", None)).await;
        idle(&h).await;
        let evs = fx.events().await;
        assert!(matches!(
            last_end(&evs),
            Some(HarnessEvent::TurnDone { .. })
        ));
        assert_eq!(
            replies(&evs),
            ["seen: The user denied the tool call; it did not run."]
        );
        the_next_message_is_answered(&fx, &h, &server).await;
    }

    pub async fn a_crash_while_a_tool_runs_then_a_restore_answers_the_call_and_the_next_message_succeeds(
        ts: &TestStore,
    ) {
        let server = StrictChat::start().await;
        let fx = strict(ts, &server, |_| {}).await;
        // The first "process": its own runtime and store connection, dropped without cleanup.
        let crashed = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let model = Arc::new(server.model());
        let doomed = Fx::with_store(ts.reopen().await.unwrap(), ts, |a| a.model = model).await;
        let doomed = Fx {
            session: fx.session.clone(),
            ..doomed
        };
        let target = doomed.target.clone();
        let request = doomed.request(LaunchMode::Create, "doomed");
        let h = crashed
            .spawn(async move { target.launch_session(request).await.unwrap() })
            .await
            .unwrap();
        let body = input("call slow_effect {}");
        let rec = fx.admit(body.clone()).await;
        let epoch = h.journal_epoch();
        let (applying, attempt) = fx.attempt(&rec, epoch).await;
        let cmd = RuntimeCommand::for_attempt(&applying, attempt, epoch, body);
        crashed
            .spawn(async move { h.apply(cmd).await })
            .await
            .unwrap()
            .unwrap();
        let deadline = tokio::time::Instant::now() + WAIT;
        while doomed.blocker.started.load(Ordering::SeqCst) == 0 {
            assert!(tokio::time::Instant::now() < deadline, "the tool never ran");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        crashed.shutdown_background();
        fx.store
            .settle(SettleRequest {
                tenant: rec.tenant.clone(),
                session: rec.session.clone(),
                command: rec.command.clone(),
                epoch: fx.residency,
                expected_revision: applying.revision,
            })
            .await
            .unwrap();

        let restored = fx.launch(LaunchMode::Restore).await;
        idle(&restored).await;
        let evs = fx.events().await;
        assert_eq!(
            fx.blocker.started.load(Ordering::SeqCst),
            0,
            "a call whose outcome is unknown is not run again"
        );
        let [(_, content, true)] = &results(&evs)[..] else {
            panic!("one error result: {evs:#?}")
        };
        assert!(content.contains("Outcome unknown"), "{content}");
        assert!(matches!(
            last_end(&evs),
            Some(HarnessEvent::TurnInterrupted { reason, .. }) if reason == "restore"
        ));
        the_next_message_is_answered(&fx, &restored, &server).await;
    }

    pub async fn a_turn_failed_by_the_provider_is_reported_as_provider_and_the_next_message_succeeds(
        ts: &TestStore,
    ) {
        let server = StrictChat::start().await;
        let fx = strict(ts, &server, |_| {}).await;
        let h = fx.launch(LaunchMode::Create).await;
        fx.ok(&h, input("fail the upstream is overloaded")).await;
        idle(&h).await;
        let evs = fx.events().await;
        let Some(HarnessEvent::TurnFailed { error, .. }) = last_end(&evs) else {
            panic!("{evs:#?}")
        };
        assert_eq!(error.code, "provider");
        assert!(
            error.message.contains("the upstream is overloaded"),
            "{error:?}"
        );
        the_next_message_is_answered(&fx, &h, &server).await;
        // The failed turn stands in the history, closed by a note rather than left open.
        let sent = server.last_request();
        let roles: Vec<&str> = sent
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["role"].as_str().unwrap())
            .collect();
        assert_eq!(roles, ["user", "assistant", "user"]);
        assert!(
            sent[1]["content"].as_str().unwrap().contains("provider"),
            "{sent}"
        );
    }

    pub async fn arguments_that_are_not_json_are_answered_as_an_error_and_the_model_corrects_itself(
        ts: &TestStore,
    ) {
        let server = StrictChat::start().await;
        let fx = strict(ts, &server, |_| {}).await;
        let h = fx.launch(LaunchMode::Create).await;
        fx.ok(
            &h,
            input(r#"call echo {"text": then call echo {"text":"fixed"}"#),
        )
        .await;
        idle(&h).await;
        let evs = fx.events().await;
        let got = results(&evs);
        assert_eq!(got.len(), 2, "{evs:#?}");
        assert!(got[0].2 && got[0].1.contains("not valid JSON"), "{got:?}");
        assert!(
            got[0].1.contains(r#"{"text":"#),
            "quotes what was sent: {got:?}"
        );
        assert_eq!((got[1].1.as_str(), got[1].2), ("fixed", false));
        assert_eq!(replies(&evs), ["seen: fixed"]);
        assert!(matches!(
            last_end(&evs),
            Some(HarnessEvent::TurnDone { .. })
        ));
        the_next_message_is_answered(&fx, &h, &server).await;
    }

    pub async fn a_model_that_keeps_sending_bad_arguments_stops_at_the_step_limit(ts: &TestStore) {
        let server = StrictChat::start().await;
        let fx = strict(ts, &server, |a| a.max_steps = 3).await;
        let h = fx.launch(LaunchMode::Create).await;
        fx.ok(&h, input("repeat call echo {oops")).await;
        idle(&h).await;
        let evs = fx.events().await;
        assert_eq!(count(&evs, "assistant_message"), 3);
        assert!(results(&evs).iter().all(|r| r.2), "{evs:#?}");
        let Some(HarnessEvent::TurnFailed { error, .. }) = last_end(&evs) else {
            panic!("{evs:#?}")
        };
        assert_eq!(error.code, "step_limit");
        the_next_message_is_answered(&fx, &h, &server).await;
    }

    pub async fn a_journal_an_older_runtime_left_with_an_unanswered_call_is_sent_well_formed(
        ts: &TestStore,
    ) {
        let server = StrictChat::start().await;
        let fx = strict(ts, &server, |_| {}).await;
        let h = fx.launch(LaunchMode::Create).await;
        h.abandon().await.unwrap();
        // As a runtime without the rule wrote an interrupt at a gate: no result for the call.
        let mut lease = fx
            .store
            .journal_acquire(
                &fx.session.tenant,
                fx.rs(),
                "old-runtime",
                Duration::from_secs(60),
            )
            .await
            .unwrap();
        let rec = fx.admit(input("call launch_rocket {}")).await;
        let (applying, attempt) = fx.attempt(&rec, lease.epoch).await;
        let cause = Cause::command(rec.command.to_string());
        let events = [
            HarnessEvent::UserMessage {
                text: "call launch_rocket {}".into(),
                cause: cause.clone(),
            },
            HarnessEvent::TurnStarted {
                turn_id: "t-old".into(),
                input_event: "ev-0".into(),
                cause: Some(cause),
            },
            HarnessEvent::AssistantMessage {
                turn_id: "t-old".into(),
                step: 1,
                text: String::new(),
                tool_calls: vec![ToolCall::new("call_old", "launch_rocket", json!({}))],
            },
            HarnessEvent::TurnInterrupted {
                turn_id: "t-old".into(),
                reason: "interrupt".into(),
                cause: None,
            },
        ];
        let mut entries = vec![JournalEntry::Application {
            identity: rec.identity(),
            attempt,
            attempt_epoch: lease.epoch,
            outcome: ApplicationOutcome::Applied,
            detail: None,
        }];
        entries.extend(events.iter().enumerate().map(|(i, e)| JournalEntry::Event {
            event: EventId::new(format!("ev-{i}")).unwrap(),
            public_body: e.encode(),
            private_body: None,
            cause: Some(rec.runtime_command),
        }));
        lease.tip = fx.store.journal_append(&lease, entries).await.unwrap();
        fx.store
            .settle(SettleRequest {
                tenant: rec.tenant.clone(),
                session: rec.session.clone(),
                command: rec.command.clone(),
                epoch: fx.residency,
                expected_revision: applying.revision,
            })
            .await
            .unwrap();

        let restored = fx.launch(LaunchMode::Restore).await;
        idle(&restored).await;
        let rec = fx.ok(&restored, input("and now?")).await;
        assert_eq!(rec.outcome, Some(Outcome::Applied));
        idle(&restored).await;
        let evs = fx.events().await;
        assert_eq!(server.refusals(), Vec::<String>::new());
        assert_eq!(replies(&evs), ["ok: and now?"]);
        let sent = server.last_request();
        assert_eq!(sent[2]["tool_call_id"], "call_old", "{sent}");
        assert_eq!(sent[2]["role"], "tool", "{sent}");
    }
}

sessionstore::both_backends!(cases =>
    after_an_interrupt_at_a_permission_gate_the_call_is_answered_and_the_next_message_succeeds,
    after_an_interrupt_at_an_ask_user_gate_the_question_is_answered_and_the_next_message_succeeds,
    an_interrupt_between_calls_of_one_step_answers_each_by_how_far_it_got,
    an_interrupt_at_a_gate_restored_open_answers_its_call,
    an_interrupt_while_a_tool_runs_answers_that_it_may_have_taken_effect,
    a_denied_call_is_answered_and_the_model_continues,
    a_crash_while_a_tool_runs_then_a_restore_answers_the_call_and_the_next_message_succeeds,
    a_turn_failed_by_the_provider_is_reported_as_provider_and_the_next_message_succeeds,
    arguments_that_are_not_json_are_answered_as_an_error_and_the_model_corrects_itself,
    a_model_that_keeps_sending_bad_arguments_stops_at_the_step_limit,
    a_journal_an_older_runtime_left_with_an_unanswered_call_is_sent_well_formed,
);
