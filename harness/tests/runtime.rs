//! The harness over a real store, every case on SQLite and PostgreSQL.

mod support;

mod cases {
    use std::sync::Arc;
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    use department::{
        Capabilities, LaunchError, LaunchMode, LaunchTarget, Recovery, Runtime, RuntimeCommand,
    };
    use harness::events::HarnessEvent;
    use sessionstore::testing::TestStore;
    use sessionstore::wire::CommandBodyV1;
    use sessionstore::*;

    use super::support::*;

    pub async fn create_with_a_first_message_is_applied_and_the_reply_is_journaled(ts: &TestStore) {
        let fx = Fx::new(ts).await;
        let h = fx.launch(LaunchMode::Create).await;
        let (rec, r) = fx
            .send(
                &h,
                CommandBodyV1::Create {
                    text: Some("hello".into()),
                },
            )
            .await;
        assert_eq!(r.unwrap().disposition, Disposition::Applied);
        assert_eq!(rec.state, CommandState::Applied);
        idle(&h).await;
        let evs = fx.events().await;
        let types: Vec<_> = evs.iter().map(|e| e.type_name()).collect();
        assert_eq!(
            types,
            [
                "session_started",
                "user_message",
                "turn_started",
                "assistant_message",
                "turn_done"
            ]
        );
        assert_eq!(replies(&evs), ["You said: hello"]);
    }

    pub async fn every_command_kind_settles_from_the_runtimes_disposition(ts: &TestStore) {
        let fx = Fx::new(ts).await;
        let h = fx.launch(LaunchMode::Create).await;
        let (r1, _) = fx.send(&h, CommandBodyV1::Create { text: None }).await;
        assert_eq!(r1.outcome, Some(Outcome::Applied));
        let (r2, _) = fx.send(&h, CommandBodyV1::Restore).await;
        assert_eq!(r2.outcome, Some(Outcome::Applied));
        let (r3, _) = fx.send(&h, input("")).await;
        assert_eq!(r3.outcome, Some(Outcome::Refused));
        let (r4, _) = fx.send(&h, CommandBodyV1::Interrupt).await;
        assert_eq!(r4.outcome, Some(Outcome::NoOp), "nothing to interrupt");
        let (r5, _) = fx
            .send(&h, answer(uuid::Uuid::now_v7(), "approve", None))
            .await;
        assert_eq!(r5.outcome, Some(Outcome::NoOp), "no such gate");
        let (r6, _) = fx.send(&h, input("two")).await;
        assert_eq!(r6.outcome, Some(Outcome::Applied));
        idle(&h).await;
        assert_eq!(replies(&fx.events().await), ["You said: two"]);
    }

    pub async fn a_duplicate_delivery_returns_the_recorded_disposition_and_writes_nothing(
        ts: &TestStore,
    ) {
        let fx = Fx::new(ts).await;
        let h = fx.launch(LaunchMode::Create).await;
        let rec = fx.admit(input("once")).await;
        let epoch = h.journal_epoch();
        let (applying, attempt) = fx.attempt(&rec, epoch).await;
        let cmd = RuntimeCommand::for_attempt(&applying, attempt, epoch, input("once"));
        let first = h.apply(cmd.clone()).await.unwrap();
        idle(&h).await;
        let tip = fx.tip().await;
        let again = h.apply(cmd).await.unwrap();
        assert_eq!(again, first);
        assert_eq!(fx.tip().await, tip);
        assert_eq!(count(&fx.events().await, "user_message"), 1);
    }

    pub async fn a_command_for_another_session_is_refused_and_writes_nothing(ts: &TestStore) {
        let fx = Fx::new(ts).await;
        let h = fx.launch(LaunchMode::Create).await;
        let other = Fx::new(ts).await;
        let rec = other.admit(input("misrouted")).await;
        let epoch = h.journal_epoch();
        let (applying, attempt) = other.attempt(&rec, epoch).await;
        let tip = fx.tip().await;
        let err = h
            .apply(RuntimeCommand::for_attempt(
                &applying,
                attempt,
                epoch,
                input("misrouted"),
            ))
            .await
            .unwrap_err();
        assert_eq!(err.code(), "wrong_session");
        assert_eq!(fx.tip().await, tip);
    }

    pub async fn an_interrupt_cancels_the_turn_in_flight(ts: &TestStore) {
        let fx = Fx::new(ts).await;
        let h = fx.launch(LaunchMode::Create).await;
        let words = vec!["word"; 200].join(" ");
        fx.ok(&h, input(&format!("/slow 50 {words}"))).await;
        streaming(&h).await;
        let (rec, r) = fx.send(&h, CommandBodyV1::Interrupt).await;
        assert_eq!(r.unwrap().disposition, Disposition::Applied);
        assert_eq!(rec.state, CommandState::Applied);
        idle(&h).await;
        let evs = fx.events().await;
        let interrupted: Vec<_> = evs
            .iter()
            .filter_map(|e| match e {
                HarnessEvent::TurnInterrupted { reason, cause, .. } => {
                    Some((reason.clone(), cause.clone()))
                }
                _ => None,
            })
            .collect();
        assert_eq!(interrupted.len(), 1);
        assert_eq!(interrupted[0].0, "interrupt");
        assert_eq!(
            interrupted[0].1.as_ref().unwrap().command_id,
            rec.command.as_str()
        );
        assert_eq!(turns_done(&evs), 1, "exactly one terminal event");
        assert_eq!(
            count(&evs, "assistant_message"),
            0,
            "the step never completed"
        );
    }

    pub async fn a_permission_gate_is_approved_and_the_tool_runs_once(ts: &TestStore) {
        let fx = Fx::new(ts).await;
        let h = fx.launch(LaunchMode::Create).await;
        fx.ok(&h, input("/tool launch_rocket {}")).await;
        let gate = fx.open_gate().await;
        assert!(!*h.idle().borrow(), "a session at a gate is not idle");
        assert_eq!(
            fx.counter.runs.load(Ordering::SeqCst),
            0,
            "nothing runs before approval"
        );
        let (rec, _) = fx.send(&h, answer(gate, "approve", None)).await;
        assert_eq!(rec.outcome, Some(Outcome::Applied));
        idle(&h).await;
        assert_eq!(fx.counter.runs.load(Ordering::SeqCst), 1);
        assert_eq!(
            replies(&fx.events().await),
            ["Tool launch_rocket returned: launched (run 1)"]
        );
        // The gate is closed now: a second answer settles no_op.
        let (again, _) = fx.send(&h, answer(gate, "approve", None)).await;
        assert_eq!(again.outcome, Some(Outcome::NoOp));
        assert_eq!(fx.counter.runs.load(Ordering::SeqCst), 1);
    }

    pub async fn a_denied_permission_runs_nothing(ts: &TestStore) {
        let fx = Fx::new(ts).await;
        let h = fx.launch(LaunchMode::Create).await;
        fx.ok(&h, input("/tool launch_rocket {}")).await;
        let gate = fx.open_gate().await;
        let (bad, _) = fx.send(&h, answer(gate, "answer", Some("x"))).await;
        assert_eq!(
            bad.outcome,
            Some(Outcome::Refused),
            "an action the gate does not offer"
        );
        let (rec, _) = fx.send(&h, answer(gate, "deny", None)).await;
        assert_eq!(rec.outcome, Some(Outcome::Applied));
        idle(&h).await;
        assert_eq!(fx.counter.runs.load(Ordering::SeqCst), 0);
        let evs = fx.events().await;
        assert!(
            evs.iter()
                .any(|e| matches!(e, HarnessEvent::ToolResult { is_error: true, .. }))
        );
    }

    pub async fn an_unanswered_permission_gate_times_out_denying(ts: &TestStore) {
        let fx = Fx::with_store(ts.store.clone(), ts, |a| {
            a.permission_timeout = Duration::from_millis(300)
        })
        .await;
        let h = fx.launch(LaunchMode::Create).await;
        fx.ok(&h, input("/tool launch_rocket {}")).await;
        fx.open_gate().await;
        idle(&h).await;
        assert_eq!(fx.counter.runs.load(Ordering::SeqCst), 0);
        let evs = fx.events().await;
        assert!(evs.iter().any(
            |e| matches!(e, HarnessEvent::GateResolved { action, .. } if action == "timeout")
        ));
        assert_eq!(
            harness::agent::DEFAULT_PERMISSION_TIMEOUT,
            Duration::from_secs(300)
        );
    }

    pub async fn an_ask_user_answer_is_the_tools_result(ts: &TestStore) {
        let fx = Fx::new(ts).await;
        let h = fx.launch(LaunchMode::Create).await;
        fx.ok(&h, input("/ask What colour?")).await;
        let gate = fx.open_gate().await;
        let (missing, _) = fx.send(&h, answer(gate, "answer", None)).await;
        assert_eq!(
            missing.outcome,
            Some(Outcome::Refused),
            "an answer needs text"
        );
        let (rec, _) = fx.send(&h, answer(gate, "answer", Some("blue"))).await;
        assert_eq!(rec.outcome, Some(Outcome::Applied));
        idle(&h).await;
        assert_eq!(
            replies(&fx.events().await),
            ["Tool ask_user returned: blue"]
        );
    }

    pub async fn a_restore_resumes_a_turn_dropped_mid_stream(ts: &TestStore) {
        let fx = Fx::new(ts).await;
        // The first "process": its own runtime and store connection, dropped without cleanup.
        let crashed = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let store2 = ts.reopen().await.unwrap();
        let fx2 = Fx::with_store(store2, ts, |_| {}).await;
        let fx2 = Fx {
            session: fx.session.clone(),
            ..fx2
        };
        let target = fx2.target.clone();
        let request = fx2.request(LaunchMode::Create, "doomed");
        let words = vec!["w"; 100].join(" ");
        let h = crashed
            .spawn(async move { target.launch_session(request).await.unwrap() })
            .await
            .unwrap();
        let body = input(&format!("/slow 30 {words}"));
        let rec = fx.admit(body.clone()).await;
        let epoch = h.journal_epoch();
        let (applying, attempt) = fx.attempt(&rec, epoch).await;
        let cmd = RuntimeCommand::for_attempt(&applying, attempt, epoch, body);
        let h2 = h.clone();
        crashed
            .spawn(async move { h2.apply(cmd).await })
            .await
            .unwrap()
            .unwrap();
        streaming(&h).await;
        crashed.shutdown_background();
        // The successor restores and finishes the turn exactly once.
        let restored = fx.launch(LaunchMode::Restore).await;
        idle(&restored).await;
        let evs = fx.events().await;
        assert_eq!(count(&evs, "turn_started"), 1);
        assert_eq!(turns_done(&evs), 1);
        assert_eq!(count(&evs, "turn_done"), 1);
        assert_eq!(replies(&evs), [words]);
    }

    pub async fn an_accepted_input_whose_turn_never_started_runs_once_on_restore(ts: &TestStore) {
        let fx = Fx::new(ts).await;
        // A runtime that accepted an input and died before its turn: written as it would have.
        let h = fx.launch(LaunchMode::Create).await;
        h.abandon().await.unwrap();
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
        let rec = fx.admit(input("remember me")).await;
        let (applying, attempt) = fx.attempt(&rec, lease.epoch).await;
        let user = HarnessEvent::UserMessage {
            text: "remember me".into(),
            cause: harness::events::Cause::command(rec.command.to_string()),
        };
        lease.tip = fx
            .store
            .journal_append(
                &lease,
                vec![
                    JournalEntry::Application {
                        identity: rec.identity(),
                        attempt,
                        attempt_epoch: lease.epoch,
                        outcome: ApplicationOutcome::Applied,
                        detail: None,
                    },
                    JournalEntry::Event {
                        event: EventId::new("ev-user").unwrap(),
                        public_body: user.encode(),
                        private_body: None,
                        cause: Some(rec.runtime_command),
                    },
                ],
            )
            .await
            .unwrap();
        let restored = fx.launch(LaunchMode::Restore).await;
        idle(&restored).await;
        let evs = fx.events().await;
        assert_eq!(replies(&evs), ["You said: remember me"]);
        assert_eq!(count(&evs, "turn_started"), 1);
        // The store settles the command from the old runtime's evidence.
        let settled = fx
            .store
            .settle(SettleRequest {
                tenant: rec.tenant.clone(),
                session: rec.session.clone(),
                command: rec.command.clone(),
                epoch: fx.residency,
                expected_revision: applying.revision,
            })
            .await
            .unwrap();
        assert_eq!(settled.outcome, Some(Outcome::Applied));
    }

    pub async fn a_permission_gate_restored_open_resumes_and_the_approved_tool_runs_once(
        ts: &TestStore,
    ) {
        let fx = Fx::new(ts).await;
        let h = fx.launch(LaunchMode::Create).await;
        fx.ok(&h, input("/tool launch_rocket {}")).await;
        let gate = fx.open_gate().await;
        // A crash-equivalent stop: nothing written, the gate stays open.
        let tip = fx.tip().await;
        h.abandon().await.unwrap();
        assert_eq!(fx.tip().await, tip);
        let restored = fx.launch(LaunchMode::Restore).await;
        assert!(
            !*restored.idle().borrow(),
            "a restored gated session is not idle"
        );
        let (rec, _) = fx.send(&restored, answer(gate, "approve", None)).await;
        assert_eq!(rec.outcome, Some(Outcome::Applied));
        idle(&restored).await;
        assert_eq!(fx.counter.runs.load(Ordering::SeqCst), 1);
        let evs = fx.events().await;
        assert_eq!(count(&evs, "turn_started"), 1);
        assert_eq!(count(&evs, "turn_done"), 1);
        assert_eq!(
            replies(&evs),
            ["Tool launch_rocket returned: launched (run 1)"]
        );
    }

    pub async fn an_ask_user_gate_restored_open_delivers_its_answer_to_the_tool(ts: &TestStore) {
        let fx = Fx::new(ts).await;
        let h = fx.launch(LaunchMode::Create).await;
        fx.ok(&h, input("/ask Which city?")).await;
        let gate = fx.open_gate().await;
        h.abandon().await.unwrap();
        let restored = fx.launch(LaunchMode::Restore).await;
        fx.ok(&restored, answer(gate, "answer", Some("Lyon"))).await;
        idle(&restored).await;
        assert_eq!(
            replies(&fx.events().await),
            ["Tool ask_user returned: Lyon"]
        );
    }

    pub async fn a_restore_replays_the_conversation_for_the_next_turn(ts: &TestStore) {
        let fx = Fx::new(ts).await;
        let h = fx.launch(LaunchMode::Create).await;
        fx.ok(&h, input("first")).await;
        idle(&h).await;
        h.release().await.unwrap();
        let restored = fx.launch(LaunchMode::Restore).await;
        fx.ok(&restored, input("second")).await;
        idle(&restored).await;
        let requests = fx.model.requests.lock().unwrap().clone();
        let last = requests.last().unwrap();
        let texts: Vec<String> = last.messages.iter().map(|m| format!("{m:?}")).collect();
        assert!(texts[0].contains("first"), "{texts:?}");
        assert!(texts[1].contains("You said: first"), "{texts:?}");
        assert!(texts[2].contains("second"), "{texts:?}");
    }

    pub async fn a_restore_folds_a_journal_longer_than_one_read_page_whole(ts: &TestStore) {
        let fx = Fx::new(ts).await;
        let h = fx.launch(LaunchMode::Create).await;
        let turns = 80;
        for i in 0..turns {
            fx.ok(&h, input(&format!("m{i}"))).await;
            idle(&h).await;
        }
        h.release().await.unwrap();
        assert!(
            fx.tip().await > 2 * 128,
            "the journal must span several restore pages"
        );
        let restored = fx.launch(LaunchMode::Restore).await;
        fx.ok(&restored, input("last")).await;
        idle(&restored).await;
        let requests = fx.model.requests.lock().unwrap().clone();
        let texts: Vec<String> = requests
            .last()
            .unwrap()
            .messages
            .iter()
            .map(|m| format!("{m:?}"))
            .collect();
        assert_eq!(texts.len(), 2 * turns + 1, "{texts:?}");
        for i in 0..turns {
            assert!(texts[2 * i].contains(&format!("m{i}")), "{texts:?}");
            assert!(
                texts[2 * i + 1].contains(&format!("You said: m{i}")),
                "{texts:?}"
            );
        }
        assert!(texts[2 * turns].contains("last"), "{texts:?}");
    }

    pub async fn create_refuses_an_existing_conversation_and_restore_an_absent_one(ts: &TestStore) {
        let fx = Fx::new(ts).await;
        let err = fx
            .target
            .launch_session(fx.request(LaunchMode::Restore, "r"))
            .await
            .unwrap_err();
        assert!(matches!(err, LaunchError::NoConversation), "{err}");
        let h = fx.launch(LaunchMode::Create).await;
        h.release().await.unwrap();
        let tip = fx.tip().await;
        let err = fx
            .target
            .launch_session(fx.request(LaunchMode::Create, "c"))
            .await
            .unwrap_err();
        assert!(matches!(err, LaunchError::ConversationExists), "{err}");
        assert_eq!(fx.tip().await, tip, "a refused create writes nothing");
    }

    pub async fn a_closure_needs_a_later_epoch_and_no_effect(ts: &TestStore) {
        let fx = Fx::new(ts).await;
        let h = fx.launch(LaunchMode::Create).await;
        let e1 = h.journal_epoch();
        // A stranded attempt (begun, never dispatched) and an applied one.
        let stranded = fx.admit(input("lost")).await;
        let (stranded, sa) = fx.attempt(&stranded, e1).await;
        let ident = stranded.identity();
        let own = h.close_attempt(ident.clone(), sa, e1).await.unwrap_err();
        assert_eq!(
            own.code(),
            "epoch",
            "a runtime never closes its own epoch's attempt"
        );
        let (applied, _) = fx.send(&h, input("kept")).await;
        idle(&h).await;
        h.abandon().await.unwrap();
        let restored = fx.launch(LaunchMode::Restore).await;
        assert!(restored.journal_epoch() > e1);
        let closed = restored.close_attempt(ident, sa, e1).await.unwrap();
        assert_eq!(closed.disposition, Disposition::NotApplied);
        // The applied command's disposition is returned, not closed over.
        let a = applied.attempt.clone().unwrap();
        let back = restored
            .close_attempt(applied.identity(), a.id, a.journal_epoch)
            .await
            .unwrap();
        assert_eq!(back.disposition, Disposition::Applied);
    }

    pub async fn a_closure_is_refused_when_the_journal_holds_an_effect_of_the_command(
        ts: &TestStore,
    ) {
        let fx = Fx::new(ts).await;
        let h = fx.launch(LaunchMode::Create).await;
        h.abandon().await.unwrap();
        // A predecessor wrote an effect of the command but (somehow) no disposition.
        let lease = fx
            .store
            .journal_acquire(&fx.session.tenant, fx.rs(), "odd", Duration::from_secs(60))
            .await
            .unwrap();
        let rec = fx.admit(input("x")).await;
        let (_, attempt) = fx.attempt(&rec, lease.epoch).await;
        fx.store
            .journal_append(
                &lease,
                vec![JournalEntry::Event {
                    event: EventId::new("ev-effect").unwrap(),
                    public_body: HarnessEvent::UserMessage {
                        text: "x".into(),
                        cause: harness::events::Cause::command(rec.command.to_string()),
                    }
                    .encode(),
                    private_body: None,
                    cause: Some(rec.runtime_command),
                }],
            )
            .await
            .unwrap();
        let restored = fx.launch(LaunchMode::Restore).await;
        let err = restored
            .close_attempt(rec.identity(), attempt, lease.epoch)
            .await
            .unwrap_err();
        assert_eq!(err.code(), "closure_refused");
    }

    pub async fn a_journal_write_failure_latches_a_persistence_fault(ts: &TestStore) {
        let own = ts.reopen().await.unwrap();
        let fx = Fx::with_store(own.clone(), ts, |_| {}).await;
        let h = fx.launch(LaunchMode::Create).await;
        let mut faults = h.faults();
        assert!(faults.borrow().is_none());
        own.close().await; // the runtime's store goes away under it
        let (_, r) = fx.send(&h, input("lost")).await;
        assert_eq!(r.unwrap_err().code(), "persistence_fault");
        tokio::time::timeout(WAIT, faults.wait_for(|f| f.is_some()))
            .await
            .unwrap()
            .unwrap();
        let (_, r) = fx.send(&h, input("later")).await;
        assert_eq!(
            r.unwrap_err().code(),
            "persistence_fault",
            "the fault stays latched"
        );
    }

    pub async fn losing_the_journal_lease_stops_all_writes(ts: &TestStore) {
        let fx = Fx::new(ts).await;
        let h = fx.launch(LaunchMode::Create).await;
        // A successor takes the journal over.
        fx.store
            .journal_acquire(
                &fx.session.tenant,
                fx.rs(),
                "successor",
                Duration::from_secs(60),
            )
            .await
            .unwrap();
        let tip = fx.tip().await;
        let (_, r) = fx.send(&h, input("stale")).await;
        assert!(matches!(r.unwrap_err().code(), "lease_lost" | "epoch"));
        assert_eq!(fx.tip().await, tip, "nothing written under a lost lease");
        tokio::time::timeout(WAIT, h.faults().wait_for(|f| f.is_some()))
            .await
            .unwrap()
            .unwrap();
    }

    pub async fn abandonment_writes_nothing_and_releases_the_journal_lease(ts: &TestStore) {
        let fx = Fx::new(ts).await;
        let h = fx.launch(LaunchMode::Create).await;
        let words = vec!["w"; 200].join(" ");
        fx.ok(&h, input(&format!("/slow 30 {words}"))).await;
        streaming(&h).await;
        department::PersistenceFaults::abandon(&h).await.unwrap();
        assert!(!*h.alive().borrow());
        let tip = fx.tip().await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(fx.tip().await, tip);
        let evs = fx.events().await;
        assert_eq!(turns_done(&evs), 0, "no interruption was journaled");
        let lease = fx
            .store
            .journal_lease_state(&fx.session.tenant, fx.rs())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(lease.holder, None);
    }

    pub async fn release_is_refused_while_the_session_is_not_idle(ts: &TestStore) {
        let fx = Fx::new(ts).await;
        let h = fx.launch(LaunchMode::Create).await;
        fx.ok(&h, input("/tool launch_rocket {}")).await;
        let gate = fx.open_gate().await;
        assert_eq!(h.release().await.unwrap_err().code(), "not_idle");
        fx.ok(&h, answer(gate, "deny", None)).await;
        idle(&h).await;
        h.release().await.unwrap();
        let lease = fx
            .store
            .journal_lease_state(&fx.session.tenant, fx.rs())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(lease.holder, None);
    }

    pub async fn no_private_id_appears_in_a_public_event_body(ts: &TestStore) {
        let fx = Fx::new(ts).await;
        let h = fx.launch(LaunchMode::Create).await;
        let (c1, _) = fx
            .send(
                &h,
                CommandBodyV1::Create {
                    text: Some("hi".into()),
                },
            )
            .await;
        let (c2, _) = fx.send(&h, input("/ask ok?")).await;
        let gate = fx.open_gate().await;
        let (c3, _) = fx.send(&h, answer(gate, "answer", Some("yes"))).await;
        idle(&h).await;
        let page = fx
            .store
            .journal_public_page(&fx.session.tenant, fx.rs(), 0, None, 1000)
            .await
            .unwrap();
        let private: Vec<String> = [fx.rs().to_string()]
            .into_iter()
            .chain(
                [&c1, &c2, &c3]
                    .iter()
                    .map(|c| c.runtime_command.to_string()),
            )
            .collect();
        for e in &page.events {
            let body = String::from_utf8(e.body.clone()).unwrap();
            for p in &private {
                assert!(!body.contains(p.as_str()), "private id {p} in {body}");
            }
        }
        assert!(
            page.events
                .iter()
                .any(|e| String::from_utf8_lossy(&e.body).contains(c3.command.as_str()))
        );
    }

    pub async fn a_turn_previews_its_reasoning_and_each_tool_steps_start_and_finish_without_raw_arguments(
        ts: &TestStore,
    ) {
        let fx = Fx::new(ts).await;
        let h = fx.launch(LaunchMode::Create).await;
        let mut previews = h.previews();
        fx.ok(&h, input("/think weigh both options")).await;
        idle(&h).await;
        fx.ok(&h, input(r#"/tool echo {"text":"secret-ish"}"#))
            .await;
        idle(&h).await;
        let mut seen = Vec::new();
        while let Ok(p) = previews.try_recv() {
            seen.push(p);
        }
        let reasoning: String = seen
            .iter()
            .filter(|p| p.kind == department::PreviewKind::Reasoning)
            .map(|p| p.delta.as_str())
            .collect();
        assert_eq!(reasoning, "weigh both options");
        let steps: Vec<_> = seen
            .iter()
            .filter(|p| {
                matches!(
                    p.kind,
                    department::PreviewKind::ToolStarted { .. }
                        | department::PreviewKind::ToolFinished { .. }
                )
            })
            .collect();
        assert_eq!(steps.len(), 2, "{seen:#?}");
        let department::PreviewKind::ToolStarted { call_id, name } = &steps[0].kind else {
            panic!("{:?}", steps[0])
        };
        assert_eq!(name, "echo");
        // The start shows the tool's own summary, never its arguments.
        assert_eq!(steps[0].delta, "echo 10 characters");
        assert!(!steps[0].delta.contains("secret-ish"));
        let department::PreviewKind::ToolFinished {
            call_id: finished,
            is_error,
            ..
        } = &steps[1].kind
        else {
            panic!("{:?}", steps[1])
        };
        assert_eq!(finished, call_id);
        assert!(!is_error);
        assert_eq!(steps[1].delta, "secret-ish");
        // Reasoning is previewed only: no event the model's steps wrote carries it.
        for e in fx.events().await {
            if !matches!(e, HarnessEvent::UserMessage { .. }) {
                assert!(!format!("{e:?}").contains("weigh both"), "{e:?}");
            }
        }
    }

    /// Where the harness records who asked: the `cause` of the user message the input wrote.
    struct HarnessAttribution;

    #[async_trait::async_trait]
    impl department::conformance::AttributionReader for HarnessAttribution {
        async fn recorded(
            &self,
            store: &Store,
            tenant: &TenantId,
            runtime_session: RuntimeSessionId,
            command: RuntimeCommandId,
        ) -> Result<Option<department::conformance::Attribution>, String> {
            let page = store
                .journal_runtime_page(tenant, runtime_session, 0, 1000)
                .await
                .map_err(|e| e.to_string())?;
            for r in page {
                if let RecordKind::Event {
                    public_body,
                    cause: Some(c),
                    ..
                } = r.kind
                    && c == command
                    && let Ok(HarnessEvent::UserMessage { cause, .. }) =
                        HarnessEvent::decode(&public_body)
                {
                    return Ok(Some(department::conformance::Attribution {
                        principal: cause.principal,
                        metadata: cause.metadata,
                    }));
                }
            }
            Ok(None)
        }
    }

    pub async fn the_harness_target_passes_the_runtime_conformance_kit(ts: &TestStore) {
        let fx = Fx::new(ts).await;
        let report = department::conformance::run_runtime_conformance_with(
            Arc::new(fx.target.clone()),
            &ts.store,
            department::conformance::KitOptions {
                attribution: Some(Arc::new(HarnessAttribution)),
            },
        )
        .await
        .unwrap();
        assert!(report.restored_epoch > report.first_epoch);
        assert!(report.attribution_checked);
    }

    /// A runtime that drops who asked: the kit names the broken promise.
    struct Forgetful;

    #[async_trait::async_trait]
    impl department::conformance::AttributionReader for Forgetful {
        async fn recorded(
            &self,
            _: &Store,
            _: &TenantId,
            _: RuntimeSessionId,
            _: RuntimeCommandId,
        ) -> Result<Option<department::conformance::Attribution>, String> {
            Ok(Some(department::conformance::Attribution {
                principal: None,
                metadata: None,
            }))
        }
    }

    pub async fn the_kit_fails_a_runtime_that_does_not_record_who_asked(ts: &TestStore) {
        let fx = Fx::new(ts).await;
        let e = department::conformance::run_runtime_conformance_with(
            Arc::new(fx.target.clone()),
            &ts.store,
            department::conformance::KitOptions {
                attribution: Some(Arc::new(Forgetful)),
            },
        )
        .await
        .unwrap_err();
        assert_eq!(e.step, "attribution", "{e}");
    }

    /// A real harness runtime with a capability stripped, as a broken adapter would hand it over.
    struct Stripping(harness::HarnessTarget);

    #[async_trait::async_trait]
    impl LaunchTarget for Stripping {
        fn capabilities(&self) -> Capabilities {
            Capabilities {
                recovery: Recovery::full(),
                ..Capabilities::default()
            }
        }
        fn compatibility(&self) -> CompatibilityId {
            self.0.compatibility()
        }
        async fn launch(&self, request: department::LaunchRequest) -> Result<Runtime, LaunchError> {
            let mut r = self.0.launch(request).await?;
            r.closer = None;
            Ok(r)
        }
    }

    /// A real harness target that launches under another runtime session than the binding
    /// names, as a confused adapter would.
    struct Mislabelled(harness::HarnessTarget, RuntimeSessionId);

    #[async_trait::async_trait]
    impl LaunchTarget for Mislabelled {
        fn capabilities(&self) -> Capabilities {
            self.0.capabilities()
        }
        fn compatibility(&self) -> CompatibilityId {
            self.0.compatibility()
        }
        async fn launch(
            &self,
            mut request: department::LaunchRequest,
        ) -> Result<Runtime, LaunchError> {
            request.binding.runtime_session_id = self.1;
            self.0.launch(request).await
        }
    }

    pub async fn a_runtime_under_another_identity_than_its_binding_is_refused_and_released(
        ts: &TestStore,
    ) {
        let fx = Fx::new(ts).await;
        let other = RuntimeSessionId::mint();
        let target = Mislabelled(fx.target.clone(), other);
        let err = department::launch_verified(&target, fx.request(mode(LaunchMode::Create), "x"))
            .await
            .unwrap_err();
        assert_eq!(err.code(), "identity", "{err}");
        let lease = fx
            .store
            .journal_lease_state(&fx.session.tenant, other)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(lease.holder, None, "the refused runtime was released");
    }

    pub async fn a_runtime_missing_a_declared_capability_is_refused_and_released(ts: &TestStore) {
        let fx = Fx::new(ts).await;
        let target = Stripping(fx.target.clone());
        let err = department::launch_verified(&target, fx.request(mode(LaunchMode::Create), "x"))
            .await
            .unwrap_err();
        assert_eq!(err.code(), "incapable");
        assert!(err.to_string().contains("attempt_closer"), "{err}");
        let lease = fx
            .store
            .journal_lease_state(&fx.session.tenant, fx.rs())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(lease.holder, None, "the refused runtime was released");
    }
}

sessionstore::both_backends!(cases =>
    a_runtime_under_another_identity_than_its_binding_is_refused_and_released,
    create_with_a_first_message_is_applied_and_the_reply_is_journaled,
    every_command_kind_settles_from_the_runtimes_disposition,
    a_duplicate_delivery_returns_the_recorded_disposition_and_writes_nothing,
    an_interrupt_cancels_the_turn_in_flight,
    a_command_for_another_session_is_refused_and_writes_nothing,
    a_permission_gate_is_approved_and_the_tool_runs_once,
    a_denied_permission_runs_nothing,
    an_unanswered_permission_gate_times_out_denying,
    an_ask_user_answer_is_the_tools_result,
    a_restore_resumes_a_turn_dropped_mid_stream,
    an_accepted_input_whose_turn_never_started_runs_once_on_restore,
    a_permission_gate_restored_open_resumes_and_the_approved_tool_runs_once,
    an_ask_user_gate_restored_open_delivers_its_answer_to_the_tool,
    a_restore_replays_the_conversation_for_the_next_turn,
    a_restore_folds_a_journal_longer_than_one_read_page_whole,
    create_refuses_an_existing_conversation_and_restore_an_absent_one,
    a_closure_needs_a_later_epoch_and_no_effect,
    a_closure_is_refused_when_the_journal_holds_an_effect_of_the_command,
    a_journal_write_failure_latches_a_persistence_fault,
    losing_the_journal_lease_stops_all_writes,
    abandonment_writes_nothing_and_releases_the_journal_lease,
    release_is_refused_while_the_session_is_not_idle,
    no_private_id_appears_in_a_public_event_body,
    the_harness_target_passes_the_runtime_conformance_kit,
    the_kit_fails_a_runtime_that_does_not_record_who_asked,
    a_turn_previews_its_reasoning_and_each_tool_steps_start_and_finish_without_raw_arguments,
    a_runtime_missing_a_declared_capability_is_refused_and_released,
);
