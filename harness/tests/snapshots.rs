//! Journal snapshots and the bounds on what a session holds in memory, every case on SQLite
//! and PostgreSQL: a restore starts from the newest usable snapshot and folds the records
//! after it, an unusable snapshot means the whole journal is folded (never another state), a
//! command recorded long ago is answered from the journal, and the conversation kept (and
//! sent to the model) is the configured window.

mod support;

mod cases {
    use std::sync::atomic::Ordering;

    use department::{LaunchMode, RuntimeCommand};
    use sessionstore::testing::{TestBackend, TestStore};
    use sessionstore::*;

    use super::support::*;

    /// The messages of the newest model request, as text.
    fn last_request(fx: &Fx) -> Vec<String> {
        let requests = fx.model.requests.lock().unwrap().clone();
        requests
            .last()
            .expect("the model was asked")
            .messages
            .iter()
            .map(|m| format!("{m:?}"))
            .collect()
    }

    /// `turns` turns of `prefix{i}`, each waited for.
    async fn converse(fx: &Fx, h: &harness::SessionHandle, prefix: &str, turns: usize) {
        for i in 0..turns {
            fx.ok(h, input(&format!("{prefix}{i}"))).await;
            idle(h).await;
        }
    }

    async fn snapshot(fx: &Fx) -> Option<JournalSnapshot> {
        fx.store
            .journal_snapshot(&fx.session.tenant, fx.rs())
            .await
            .unwrap()
    }

    pub async fn a_warm_release_checkpoints_and_the_restore_continues_the_same_conversation(
        ts: &TestStore,
    ) {
        let fx = Fx::new(ts).await;
        let h = fx.launch(LaunchMode::Create).await;
        converse(&fx, &h, "m", 3).await;
        let tip = fx.tip().await;
        assert_eq!(snapshot(&fx).await, None, "not due before the cadence");
        h.release().await.unwrap();
        let snap = snapshot(&fx).await.expect("a warm release checkpoints");
        assert_eq!(snap.seq, tip);
        assert_eq!(fx.tip().await, tip, "a snapshot is not a journal record");
        let restored = fx.launch(LaunchMode::Restore).await;
        assert_eq!(fx.target.snapshot_counts().restored_from, 1);
        fx.ok(&restored, input("next")).await;
        idle(&restored).await;
        let texts = last_request(&fx);
        assert_eq!(texts.len(), 7, "{texts:?}");
        for i in 0..3 {
            assert!(texts[2 * i].contains(&format!("m{i}")), "{texts:?}");
            assert!(
                texts[2 * i + 1].contains(&format!("You said: m{i}")),
                "{texts:?}"
            );
        }
        assert!(texts[6].contains("next"), "{texts:?}");
    }

    pub async fn a_running_session_checkpoints_every_n_records_without_holding_up_its_appends(
        ts: &TestStore,
    ) {
        let fx = Fx::with_store(ts.store.clone(), ts, |a| a.snapshot_every = 16).await;
        let h = fx.launch(LaunchMode::Create).await;
        converse(&fx, &h, "m", 8).await;
        let tip = fx.tip().await;
        assert!(tip >= 32, "tip {tip}");
        let deadline = tokio::time::Instant::now() + WAIT;
        let snap = loop {
            if let Some(s) = snapshot(&fx).await
                && s.seq >= 16
            {
                break s;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no snapshot by the cadence"
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        };
        assert!(
            snap.seq <= tip && tip - snap.seq < 16 + 8,
            "seq {} tip {tip}",
            snap.seq
        );
        assert!(fx.target.snapshot_counts().written >= 1);
        assert_eq!(fx.target.snapshot_counts().failed, 0);
        // Abandoned (no release snapshot): the restore starts from the cadence's snapshot and
        // folds the tail.
        h.abandon().await.unwrap();
        let restored = fx.launch(LaunchMode::Restore).await;
        assert_eq!(fx.target.snapshot_counts().restored_from, 1);
        fx.ok(&restored, input("last")).await;
        idle(&restored).await;
        let texts = last_request(&fx);
        assert_eq!(texts.len(), 17, "{texts:?}");
        assert!(texts[14].contains("m7"), "{texts:?}");
        assert!(texts[16].contains("last"), "{texts:?}");
    }

    /// Damages the stored snapshot with `sql` (`{rs}` names the runtime session).
    async fn damage(ts: &TestStore, fx: &Fx, sql: &str) {
        ts.exec_raw(&sql.replace("{rs}", &fx.rs().to_text())).await;
    }

    pub async fn an_unusable_snapshot_is_never_restored_from_and_the_whole_journal_is_folded(
        ts: &TestStore,
    ) {
        let fx = Fx::new(ts).await;
        let h = fx.launch(LaunchMode::Create).await;
        converse(&fx, &h, "m", 2).await;
        h.release().await.unwrap();
        // A body that is not what its digest says; a body of another format; a body whose
        // digest holds but that is not a fold this build reads.
        let garbage = match ts.backend {
            TestBackend::Sqlite => "CAST('{\"started\":false}' AS BLOB)",
            TestBackend::Postgres => "convert_to('{\"started\":false}', 'UTF8')",
        };
        let damages = [
            "UPDATE journal_snapshots SET sha256 = '0000000000000000000000000000000000000000000000000000000000000000' WHERE runtime_session_id = '{rs}'".to_owned(),
            "UPDATE journal_snapshots SET format = 99 WHERE runtime_session_id = '{rs}'".to_owned(),
            format!(
                "UPDATE journal_snapshots SET body = {garbage}, sha256 = '{}' WHERE runtime_session_id = '{{rs}}'",
                sha256_hex(b"{\"started\":false}")
            ),
        ];
        for (i, sql) in damages.iter().enumerate() {
            let restored = fx.launch(LaunchMode::Restore).await;
            idle(&restored).await;
            // The damage is made while a runtime holds the journal, as an operator's
            // mistake or a bad disk would; the next restore meets it.
            damage(ts, &fx, sql).await;
            restored.abandon().await.unwrap();
            let again = fx.launch(LaunchMode::Restore).await;
            let counts = fx.target.snapshot_counts();
            assert_eq!(counts.fell_back, i as u64 + 1, "{sql}");
            fx.ok(&again, input(&format!("after{i}"))).await;
            idle(&again).await;
            let texts = last_request(&fx);
            assert!(
                texts[0].contains("m0") && texts[2].contains("m1"),
                "{texts:?}"
            );
            assert!(
                texts.last().unwrap().contains(&format!("after{i}")),
                "{texts:?}"
            );
            assert_eq!(texts.len(), 2 * (2 + i) + 1, "{texts:?}");
            // The release writes a good snapshot again, over the damaged one.
            again.release().await.unwrap();
        }
        assert_eq!(fx.target.snapshot_counts().restored_from, 3);
    }

    pub async fn a_duplicate_of_a_command_recorded_before_the_restore_is_answered_from_the_journal(
        ts: &TestStore,
    ) {
        let fx = Fx::new(ts).await;
        let h = fx.launch(LaunchMode::Create).await;
        let rec = fx.admit(input("once")).await;
        let epoch = h.journal_epoch();
        let (applying, attempt) = fx.attempt(&rec, epoch).await;
        let first = h
            .apply(RuntimeCommand::for_attempt(
                &applying,
                attempt,
                epoch,
                input("once"),
            ))
            .await
            .unwrap();
        idle(&h).await;
        h.release().await.unwrap();
        let restored = fx.launch(LaunchMode::Restore).await;
        let tip = fx.tip().await;
        // Delivered again under the old epoch, and as if attempted under the new one: either
        // way the journal's disposition, and nothing written.
        let old = restored
            .apply(RuntimeCommand::for_attempt(
                &applying,
                attempt,
                epoch,
                input("once"),
            ))
            .await
            .unwrap();
        let new = restored
            .apply(RuntimeCommand::for_attempt(
                &applying,
                attempt,
                restored.journal_epoch(),
                input("once"),
            ))
            .await
            .unwrap();
        assert_eq!((old, new), (first, first));
        assert_eq!(fx.tip().await, tip);
        assert!(
            department::wait_idle(&restored, WAIT).await,
            "the refused duplicate left no fault and nothing running"
        );
        assert!(restored.faults().borrow().is_none());
        fx.ok(&restored, input("twice")).await;
        idle(&restored).await;
        assert_eq!(count(&fx.events().await, "user_message"), 2);
    }

    pub async fn a_gate_open_at_a_checkpoint_is_restored_from_the_snapshot_and_answered_once(
        ts: &TestStore,
    ) {
        let fx = Fx::with_store(ts.store.clone(), ts, |a| a.snapshot_every = 16).await;
        let h = fx.launch(LaunchMode::Create).await;
        fx.ok(&h, input("/tool launch_rocket {}")).await;
        let gate = fx.open_gate().await;
        let opened = fx.tip().await;
        // Inputs queue behind the gated turn until a checkpoint holds the open gate.
        let mut queued = 0;
        let deadline = tokio::time::Instant::now() + WAIT;
        while snapshot(&fx).await.is_none_or(|s| s.seq < opened) {
            assert!(tokio::time::Instant::now() < deadline, "no checkpoint");
            fx.ok(&h, input(&format!("q{queued}"))).await;
            queued += 1;
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        let tip = fx.tip().await;
        h.abandon().await.unwrap();
        let restored = fx.launch(LaunchMode::Restore).await;
        assert_eq!(fx.target.snapshot_counts().restored_from, 1);
        assert!(fx.tip().await > tip);
        assert!(!*restored.idle().borrow(), "restored gated");
        fx.ok(&restored, answer(gate, "approve", None)).await;
        idle(&restored).await;
        assert_eq!(fx.counter.runs.load(Ordering::SeqCst), 1);
        let evs = fx.events().await;
        let said = replies(&evs);
        assert_eq!(said.len(), 1 + queued, "{said:?}");
        assert_eq!(said[0], "Tool launch_rocket returned: launched (run 1)");
        for (i, r) in said[1..].iter().enumerate() {
            assert_eq!(r, &format!("You said: q{i}"));
        }
    }

    pub async fn a_session_keeps_and_sends_only_its_conversation_window(ts: &TestStore) {
        let fx = Fx::with_store(ts.store.clone(), ts, |a| a.conversation_turns = 3).await;
        let h = fx.launch(LaunchMode::Create).await;
        converse(&fx, &h, "m", 5).await;
        let texts = last_request(&fx);
        assert_eq!(texts.len(), 5, "two earlier turns and this one: {texts:?}");
        assert!(
            texts[0].contains("m2") && texts[4].contains("m4"),
            "{texts:?}"
        );
        // The journal keeps everything.
        assert_eq!(count(&fx.events().await, "user_message"), 5);
        // Restored from a snapshot and from the whole journal, the same window.
        h.release().await.unwrap();
        let restored = fx.launch(LaunchMode::Restore).await;
        fx.ok(&restored, input("m5")).await;
        idle(&restored).await;
        let texts = last_request(&fx);
        assert_eq!(texts.len(), 5, "{texts:?}");
        assert!(
            texts[0].contains("m3") && texts[4].contains("m5"),
            "{texts:?}"
        );
        restored.release().await.unwrap();
        ts.exec_raw(&format!(
            "DELETE FROM journal_snapshots WHERE runtime_session_id = '{}'",
            fx.rs().to_text()
        ))
        .await;
        let folded = fx.launch(LaunchMode::Restore).await;
        fx.ok(&folded, input("m6")).await;
        idle(&folded).await;
        let texts = last_request(&fx);
        assert_eq!(texts.len(), 5, "{texts:?}");
        assert!(
            texts[0].contains("m4") && texts[4].contains("m6"),
            "{texts:?}"
        );
    }
}

sessionstore::both_backends!(cases =>
    a_warm_release_checkpoints_and_the_restore_continues_the_same_conversation,
    a_running_session_checkpoints_every_n_records_without_holding_up_its_appends,
    an_unusable_snapshot_is_never_restored_from_and_the_whole_journal_is_folded,
    a_duplicate_of_a_command_recorded_before_the_restore_is_answered_from_the_journal,
    a_gate_open_at_a_checkpoint_is_restored_from_the_snapshot_and_answered_once,
    a_session_keeps_and_sends_only_its_conversation_window,
);
