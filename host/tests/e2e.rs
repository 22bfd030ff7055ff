//! A composed Host with the real harness over a real store, driven as a controller would
//! (admitting into the store and attaching), every case on SQLite and PostgreSQL.

mod cases {
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    use host::HostError;
    use sessionstore::testing::TestStore;
    use sessionstore::wire::CommandBodyV1;
    use sessionstore::*;

    use testkit::*;

    pub async fn create_with_a_first_message_is_applied_and_the_reply_is_journaled(ts: &TestStore) {
        let (svc, _) = started(ts, options("h-create")).await;
        let c = Controller::new(ts);
        let s = c.session().await;
        let create = c
            .admit(
                &s,
                CommandBodyV1::Create {
                    text: Some("hello".into()),
                },
            )
            .await;
        let a = c.attach(&svc, &s).await;
        assert!(a.attached);
        assert_eq!(a.launched, department::LaunchMode::Create);
        assert_eq!(a.observation.lease_epoch, ResidencyEpoch(1));
        let done = c.terminal(&s, &create).await;
        assert_eq!(
            (done.state, done.outcome),
            (CommandState::Applied, Some(Outcome::Applied))
        );
        let evs = c
            .wait_events(&s, "the reply", |e| count(e, "turn_done") == 1)
            .await;
        assert_eq!(replies(&evs), ["You said: hello"]);
        // Attach is idempotent for a resident session.
        let again = c.attach(&svc, &s).await;
        assert!(!again.attached);
        assert_eq!(again.observation.lease_epoch, ResidencyEpoch(1));
        // The per-session attach locks live only while an attach holds or waits for them.
        assert_eq!(svc.session_locks(), 0);
        svc.stop().await;
    }

    pub async fn input_interrupt_and_gate_responses_settle_from_the_runtime(ts: &TestStore) {
        let (svc, rocket) = started(ts, options("h-kinds")).await;
        let c = Controller::new(ts);
        let s = c.session().await;
        c.attach(&svc, &s).await;
        let i = c.send(&svc, &s, input("hi")).await;
        assert_eq!(c.terminal(&s, &i).await.outcome, Some(Outcome::Applied));
        // Interrupt a slow turn.
        let words = vec!["w"; 200].join(" ");
        let mut feed = svc.subscribe(&s.tenant, &s.session).unwrap();
        c.send(&svc, &s, input(&format!("/slow 40 {words}"))).await;
        streaming(&mut feed).await;
        let int = c.send(&svc, &s, CommandBodyV1::Interrupt).await;
        assert_eq!(c.terminal(&s, &int).await.outcome, Some(Outcome::Applied));
        c.wait_events(&s, "the interruption", |e| {
            count(e, "turn_interrupted") == 1
        })
        .await;
        // A permission gate: a bad action is refused, approve applies, a second answer is no_op.
        c.send(&svc, &s, input("/tool launch_rocket {}")).await;
        let gate = c.open_gate(&s).await;
        let bad = c.send(&svc, &s, answer(gate, "answer", Some("x"))).await;
        assert_eq!(c.terminal(&s, &bad).await.outcome, Some(Outcome::Refused));
        let ok = c.send(&svc, &s, answer(gate, "approve", None)).await;
        assert_eq!(c.terminal(&s, &ok).await.outcome, Some(Outcome::Applied));
        let late = c.send(&svc, &s, answer(gate, "approve", None)).await;
        assert_eq!(c.terminal(&s, &late).await.outcome, Some(Outcome::NoOp));
        c.wait_events(&s, "the tool result", |e| count(e, "turn_done") == 2)
            .await;
        assert_eq!(rocket.runs.load(Ordering::SeqCst), 1);
        // The projection followed the journal: open, then resolved.
        eventually("the gate to be resolved in the projection", async || {
            let open = c.store.gates(&s.tenant, &s.session, true).await.unwrap();
            check(open.is_empty(), || format!("{open:?}"))
        })
        .await;
        c.check_exactly_once(&s).await;
        svc.stop().await;
    }

    pub async fn a_body_stored_by_reference_is_dereferenced_and_verified(ts: &TestStore) {
        let (svc, _) = started(ts, options("h-payload")).await;
        let c = Controller::new(ts);
        let s = c.session().await;
        c.attach(&svc, &s).await;
        let text = "x".repeat(70 * 1024);
        let body = sessionstore::wire::encode_command_body(&input(&text));
        let r = c
            .store
            .put_object(NewObject {
                tenant: s.tenant.clone(),
                session: s.session.clone(),
                kind: "command_body".into(),
                media_type: "application/json".into(),
                bytes: body,
            })
            .await
            .unwrap();
        let cmd = c
            .admit_raw(&s, CommandKind::Input, CommandBody::Object(r.clone()))
            .await;
        svc.deliver(&s.tenant, &s.session).unwrap();
        assert_eq!(c.terminal(&s, &cmd).await.outcome, Some(Outcome::Applied));
        // A reference to bytes that are not there is rejected before any attempt.
        let mut missing = r.clone();
        missing.object_id = ObjectId::new("obj-missing").unwrap();
        let bad = c
            .admit_raw(&s, CommandKind::Input, CommandBody::Object(missing))
            .await;
        svc.deliver(&s.tenant, &s.session).unwrap();
        let bad = c.terminal(&s, &bad).await;
        assert_eq!(bad.outcome, Some(Outcome::Rejected));
        assert!(bad.attempt.is_none());
        // Bytes that are there but are not a command body (another kind of object) are
        // rejected too, even when they would decode.
        let other = c
            .store
            .put_object(NewObject {
                tenant: s.tenant.clone(),
                session: s.session.clone(),
                kind: "attachment".into(),
                media_type: "application/json".into(),
                bytes: sessionstore::wire::encode_command_body(&input(&text)),
            })
            .await
            .unwrap();
        let wrong = c
            .admit_raw(&s, CommandKind::Input, CommandBody::Object(other))
            .await;
        svc.deliver(&s.tenant, &s.session).unwrap();
        let wrong = c.terminal(&s, &wrong).await;
        assert_eq!(wrong.outcome, Some(Outcome::Rejected), "{wrong:?}");
        assert!(wrong.attempt.is_none());
        svc.stop().await;
    }

    pub async fn a_referenced_body_above_the_hosts_cap_is_rejected_before_any_attempt(
        ts: &TestStore,
    ) {
        // The controller wrote under the default cap; this Host's store allows less.
        let mut store = ts.options();
        store.referenced_body_cap = 80 * 1024;
        let svc = host::Composition {
            options: options("h-capped"),
            store,
            registrar: Box::new(HarnessRegistrar {
                rocket: Default::default(),
            }),
            profile: department::RuntimeProfile::Durable,
            version: "test".into(),
        }
        .build()
        .await
        .expect("the Host composes");
        svc.start().await.expect("the Host starts");
        let c = Controller::new(ts);
        let s = c.session().await;
        c.attach(&svc, &s).await;
        let r = c
            .store
            .put_object(NewObject {
                tenant: s.tenant.clone(),
                session: s.session.clone(),
                kind: "command_body".into(),
                media_type: "application/json".into(),
                bytes: sessionstore::wire::encode_command_body(&input(&"y".repeat(100 * 1024))),
            })
            .await
            .unwrap();
        let big = c
            .admit_raw(&s, CommandKind::Input, CommandBody::Object(r))
            .await;
        svc.deliver(&s.tenant, &s.session).unwrap();
        let big = c.terminal(&s, &big).await;
        assert_eq!(big.outcome, Some(Outcome::Rejected), "{big:?}");
        assert!(big.attempt.is_none());
        svc.stop().await;
    }

    pub async fn reference_shaped_bodies_apply_and_one_contradicting_its_admission_is_rejected(
        ts: &TestStore,
    ) {
        let (svc, _) = started(ts, options("h-reference-bodies")).await;
        let c = Controller::new(ts);
        let s = c.session().await;
        let inline = |b: &[u8]| CommandBody::Inline(b.to_vec());
        let create = c
            .admit_raw(
                &s,
                CommandKind::Create,
                inline(br#"{"version":1,"blocks":[{"type":"text","text":"hello"}],"principal":"user:1"}"#),
            )
            .await;
        c.attach(&svc, &s).await;
        assert_eq!(
            c.terminal(&s, &create).await.outcome,
            Some(Outcome::Applied)
        );
        let input = c
            .admit_raw(
                &s,
                CommandKind::Input,
                inline(br#"{"version":1,"blocks":[{"type":"text","text":"one"},{"type":"text","text":"two"}],"metadata":{"k":"v"}}"#),
            )
            .await;
        svc.deliver(&s.tenant, &s.session).unwrap();
        assert_eq!(c.terminal(&s, &input).await.outcome, Some(Outcome::Applied));
        // The admission recorded user:1; a body naming someone else is no one's to apply.
        let other = c
            .admit_raw(
                &s,
                CommandKind::Input,
                inline(br#"{"version":1,"text":"x","principal":"user:2"}"#),
            )
            .await;
        svc.deliver(&s.tenant, &s.session).unwrap();
        let other = c.terminal(&s, &other).await;
        assert_eq!(other.outcome, Some(Outcome::Rejected));
        assert!(other.attempt.is_none());
        let evs = c
            .wait_events(&s, "both replies", |e| count(e, "turn_done") == 2)
            .await;
        assert_eq!(replies(&evs), ["You said: hello", "You said: one\ntwo"]);
        c.check_exactly_once(&s).await;
        svc.stop().await;
    }

    pub async fn a_failed_mapping_read_is_retried_and_the_live_tail_skips_nothing(ts: &TestStore) {
        use host::failpoints::{self, Action, steps};
        let host = format!("h-mapping-{}", uuid::Uuid::now_v7().simple());
        let (svc, _) = started(ts, options(&host)).await;
        let c = Controller::new(ts);
        let s = c.session().await;
        c.attach(&svc, &s).await;
        let mut feed = svc.subscribe(&s.tenant, &s.session).unwrap();
        let mut routes = svc.route_invalidations();
        let key = format!("{host}:{}", steps::MAPPING_READ);
        failpoints::arm(&key, Action::Fail(3));
        let i = c.send(&svc, &s, input("through the retries")).await;
        assert_eq!(c.terminal(&s, &i).await.outcome, Some(Outcome::Applied));
        // Every committed event of the turn reaches the live tail, in journal order.
        let mut seqs = Vec::new();
        tokio::time::timeout(WAIT, async {
            loop {
                match feed.recv().await {
                    Ok(hostlink_server::FeedItem::Enduring(p)) => {
                        seqs.push(p.record.journal_seq.get());
                        if p.record.body().get().contains("turn_done") {
                            return;
                        }
                    }
                    Ok(_) => {}
                    Err(e) => panic!("the live tail ended: {e}"),
                }
            }
        })
        .await
        .expect("the turn reaches the live tail");
        assert_eq!(failpoints::hits(&key), 3, "the read failed three times");
        let journal: Vec<u64> = c
            .store
            .journal_runtime_page(&s.tenant, s.binding.runtime_session_id, 0, 1000)
            .await
            .unwrap()
            .iter()
            .map(|r| r.seq)
            .filter(|q| *q >= seqs[0] && *q <= *seqs.last().unwrap())
            .collect();
        assert_eq!(seqs, journal, "no committed event was skipped");
        // And no route was dropped for it.
        assert!(matches!(
            routes.try_recv(),
            Err(tokio::sync::broadcast::error::TryRecvError::Empty)
        ));
        svc.stop().await;
    }

    /// Reads the live feed until a record whose body contains `until`; returns each record's
    /// (journal sequence, stream offset).
    async fn relayed_until(
        feed: &mut tokio::sync::broadcast::Receiver<hostlink_server::FeedItem>,
        until: &str,
    ) -> Vec<(u64, u64)> {
        let mut seen = Vec::new();
        tokio::time::timeout(WAIT, async {
            loop {
                match feed.recv().await {
                    Ok(hostlink_server::FeedItem::Enduring(p)) => {
                        seen.push((p.record.journal_seq.get(), p.offset));
                        if p.record.body().get().contains(until) {
                            return;
                        }
                    }
                    Ok(_) => {}
                    Err(e) => panic!("the live feed ended: {e}"),
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("no record with {until} reached the live feed: {seen:?}"));
        seen
    }

    /// The session's public journal records as (journal sequence, stream offset).
    async fn journal_offsets(c: &Controller, s: &SessionRecord) -> Vec<(u64, u64)> {
        c.store
            .journal_by_offset(&s.tenant, s.binding.runtime_session_id, 0, 1000)
            .await
            .unwrap()
            .events
            .iter()
            .map(|e| (e.seq, e.offset))
            .collect()
    }

    pub async fn a_refused_publication_drops_the_sessions_routes_and_the_tail_goes_on(
        ts: &TestStore,
    ) {
        use host::failpoints::{self, Action, steps};
        let host = format!("h-refused-{}", uuid::Uuid::now_v7().simple());
        let (svc, _) = started(ts, options(&host)).await;
        let c = Controller::new(ts);
        let s = c.session().await;
        c.attach(&svc, &s).await;
        let mut feed = svc.subscribe(&s.tenant, &s.session).unwrap();
        let mut routes = svc.route_invalidations();
        let key = format!("{host}:{}", steps::PUBLISH);
        failpoints::arm(&key, Action::Fail(1));
        let i = c.send(&svc, &s, input("the first record is refused")).await;
        assert_eq!(c.terminal(&s, &i).await.outcome, Some(Outcome::Applied));
        // Every route to the session is dropped: its viewers repair from the journal.
        let dropped = tokio::time::timeout(WAIT, routes.recv())
            .await
            .expect("the session's routes are dropped")
            .unwrap();
        assert_eq!(dropped, (s.tenant.clone(), s.session.clone()));
        assert_eq!(failpoints::hits(&key), 1);
        // The tail is not ended: the records after the refused one are relayed, each at its
        // journal offset, and so is the next turn.
        let relayed = relayed_until(&mut feed, "turn_done").await;
        let next = c.send(&svc, &s, input("after the refusal")).await;
        assert_eq!(c.terminal(&s, &next).await.outcome, Some(Outcome::Applied));
        let later = relayed_until(&mut feed, "turn_done").await;
        let journal = journal_offsets(&c, &s).await;
        let first = relayed[0];
        let refused = journal
            .iter()
            .rev()
            .find(|(seq, _)| *seq < first.0)
            .copied()
            .expect("a public record before the first relayed one");
        assert_eq!(refused.1 + 1, first.1, "only the refused record is missing");
        let from: Vec<(u64, u64)> = journal
            .into_iter()
            .filter(|(seq, _)| *seq >= first.0)
            .collect();
        let all: Vec<(u64, u64)> = relayed.into_iter().chain(later).collect();
        assert_eq!(
            all, from,
            "relayed at the journal's offsets, nothing else skipped"
        );
        svc.stop().await;
    }

    pub async fn a_live_tail_that_falls_behind_drops_the_sessions_routes_and_goes_on_at_journal_offsets(
        ts: &TestStore,
    ) {
        use host::failpoints::{self, Action, steps};
        let host = format!("h-behind-{}", uuid::Uuid::now_v7().simple());
        let (svc, _) = started(ts, options(&host)).await;
        let c = Controller::new(ts);
        let s = c.session().await;
        c.attach(&svc, &s).await;
        let mut feed = svc.subscribe(&s.tenant, &s.session).unwrap();
        let mut routes = svc.route_invalidations();
        // The relay stalls on its mapping reads (about seven seconds of backoff) while the
        // runtime commits far more events than its committed-event buffer holds.
        let key = format!("{host}:{}", steps::MAPPING_READ);
        failpoints::arm(&key, Action::Fail(8));
        let first = c.send(&svc, &s, input("stall")).await;
        wait_until("the relay to stall", || failpoints::hits(&key) > 0).await;
        let mut sent = vec![first];
        for n in 0..30 {
            sent.push(c.admit(&s, input(&format!("burst {n}"))).await);
        }
        svc.deliver(&s.tenant, &s.session).unwrap();
        for cmd in &sent {
            assert_eq!(c.terminal(&s, cmd).await.outcome, Some(Outcome::Applied));
        }
        assert!(
            failpoints::hits(&key) < 8,
            "the burst committed while the relay was still stalled"
        );
        // Past the buffer: the relay learns it fell behind and drops every route.
        let dropped = tokio::time::timeout(WAIT * 2, routes.recv())
            .await
            .expect("the session's routes are dropped")
            .unwrap();
        assert_eq!(dropped, (s.tenant.clone(), s.session.clone()));
        // It goes on: what it relays from then on sits at the journal's offsets.
        let next = c.send(&svc, &s, input("after the lag")).await;
        assert_eq!(c.terminal(&s, &next).await.outcome, Some(Outcome::Applied));
        let mut relayed = Vec::new();
        tokio::time::timeout(WAIT * 2, async {
            loop {
                match feed.recv().await {
                    Ok(hostlink_server::FeedItem::Enduring(p)) => {
                        relayed.push((p.record.journal_seq.get(), p.offset));
                        if p.record.body().get().contains("after the lag") {
                            return;
                        }
                    }
                    Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                    Err(e) => panic!("the live feed ended: {e}"),
                }
            }
        })
        .await
        .expect("the next turn reaches the live feed");
        let journal = journal_offsets(&c, &s).await;
        let (from, to) = (relayed[0].0, relayed[relayed.len() - 1].0);
        let lost = journal
            .iter()
            .filter(|r| (from..=to).contains(&r.0) && !relayed.contains(r))
            .count();
        assert!(lost > 0, "the lag skipped records: {relayed:?}");
        for r in &relayed {
            assert!(journal.contains(r), "{r:?} is not at its journal offset");
        }
        svc.stop().await;
    }

    pub async fn a_gate_change_whose_hint_the_publisher_lost_is_published_from_where_it_folded(
        ts: &TestStore,
    ) {
        use host::failpoints::{self, Action, steps};
        let host = format!("h-gate-lag-{}", uuid::Uuid::now_v7().simple());
        let (svc, rocket) = started(ts, options(&host)).await;
        let c = Controller::new(ts);
        let s = c.session().await;
        c.attach(&svc, &s).await;
        // The publisher's first pass is done by the time a turn has been applied.
        let hello = c.send(&svc, &s, input("hello")).await;
        assert_eq!(c.terminal(&s, &hello).await.outcome, Some(Outcome::Applied));
        // The next pass (for the gate the tool opens) holds after its writes, unreading.
        let key = format!("{host}:{}", steps::GATE_PASS);
        let hold = Duration::from_secs(6);
        failpoints::arm(&key, Action::Delay(hold));
        c.send(&svc, &s, input("/tool launch_rocket {}")).await;
        let gate = c.open_gate(&s).await;
        let held_from = std::time::Instant::now();
        // Meanwhile the gate closes and far more than the runtime's committed-event buffer is
        // committed after it: the publisher's subscription lags past the closing event.
        let ok = c.send(&svc, &s, answer(gate, "approve", None)).await;
        assert_eq!(c.terminal(&s, &ok).await.outcome, Some(Outcome::Applied));
        let mut burst = Vec::new();
        for n in 0..30 {
            burst.push(c.admit(&s, input(&format!("burst {n}"))).await);
        }
        svc.deliver(&s.tenant, &s.session).unwrap();
        for cmd in &burst {
            assert_eq!(c.terminal(&s, cmd).await.outcome, Some(Outcome::Applied));
        }
        assert!(
            held_from.elapsed() < hold,
            "the burst was committed while the pass still held"
        );
        assert_eq!(rocket.runs.load(Ordering::SeqCst), 1);
        // The lag runs a pass that folds on from the last folded record: the gate resolves.
        eventually("the gate to be resolved in the projection", async || {
            let open = c.store.gates(&s.tenant, &s.session, true).await.unwrap();
            check(open.is_empty(), || format!("{open:?}"))
        })
        .await;
        svc.stop().await;
    }

    pub async fn a_gate_publisher_whose_mark_a_successor_fenced_stops_and_ends_the_residency(
        ts: &TestStore,
    ) {
        let (svc, _) = started(ts, options("h-superseded-publisher")).await;
        let c = Controller::new(ts);
        let s = c.session().await;
        let a = c.attach(&svc, &s).await;
        let epoch = a.observation.lease_epoch;
        // A successor's fencing write: the gate mark moves past this Host's grant.
        c.store
            .fence_gate_mark(&s.tenant, &s.session, ResidencyEpoch(epoch.0 + 1))
            .await
            .unwrap();
        // The runtime opens a gate; publishing it is refused under the old grant.
        c.send(&svc, &s, input("/tool launch_rocket {}")).await;
        wait_until("the residency to end", || svc.residents().is_empty()).await;
        let gates = c.store.gates(&s.tenant, &s.session, false).await.unwrap();
        assert!(gates.is_empty(), "nothing was published: {gates:?}");
        svc.stop().await;
    }

    pub async fn a_gate_answer_under_a_mark_that_is_not_this_hosts_grant_holds_the_whole_stream_writing_nothing(
        ts: &TestStore,
    ) {
        let (svc, rocket) = started(ts, options("h-mark-block")).await;
        let c = Controller::new(ts);
        let s = c.session().await;
        let a = c.attach(&svc, &s).await;
        c.send(&svc, &s, input("/tool launch_rocket {}")).await;
        let gate = c.open_gate(&s).await;
        c.store
            .fence_gate_mark(
                &s.tenant,
                &s.session,
                ResidencyEpoch(a.observation.lease_epoch.0 + 1),
            )
            .await
            .unwrap();
        let ok = c.send(&svc, &s, answer(gate, "approve", None)).await;
        let interrupt = c.send(&svc, &s, CommandBodyV1::Interrupt).await;
        let next = c.send(&svc, &s, input("behind the block")).await;
        wait_until("the stream to block", || {
            svc.command_blocked(&s.tenant, &s.session) == Some(true)
        })
        .await;
        // Nothing written for the answer beyond its claim; nothing behind it moves, not even
        // the interrupt; the tool never ran.
        let read = async |cmd: &CommandRecord| {
            c.store
                .command(&s.tenant, &s.session, &cmd.command)
                .await
                .unwrap()
        };
        let held = read(&ok).await;
        assert_eq!(held.state, CommandState::Claimed, "{held:?}");
        assert!(held.attempt.is_none(), "{held:?}");
        for behind in [&interrupt, &next] {
            let r = read(behind).await;
            assert_eq!(r.state, CommandState::Pending, "{r:?}");
        }
        assert_eq!(rocket.runs.load(Ordering::SeqCst), 0);
        // Still so a while later: held, not skipped.
        tokio::time::sleep(Duration::from_millis(600)).await;
        let r = read(&ok).await;
        assert!(r.attempt.is_none() && !r.state.is_terminal(), "{r:?}");
        assert_eq!(read(&next).await.state, CommandState::Pending);
        assert_eq!(svc.residents().len(), 1, "still resident, still blocked");
        assert_eq!(svc.command_blocked(&s.tenant, &s.session), Some(true));
        svc.stop().await;
    }

    pub async fn every_attempt_carries_the_journal_epoch_its_runtime_reports_and_the_attach_reports_it(
        ts: &TestStore,
    ) {
        let c = Controller::new(ts);
        let s = c.session().await;
        let attempt_epoch = async |cmd: &CommandRecord| {
            let done = c.terminal(&s, cmd).await;
            assert_eq!(done.outcome, Some(Outcome::Applied), "{done:?}");
            done.attempt.expect("an attempt").journal_epoch
        };
        let (first, _) = started(ts, options("h-journal-epoch-one")).await;
        let a = c.attach(&first, &s).await;
        assert!(a.attached);
        let one = c.send(&first, &s, input("one")).await;
        assert_eq!(attempt_epoch(&one).await, a.journal_epoch);
        first.stop().await;
        // The next Host's runtime writes under a later journal epoch: its attempts carry that.
        let (second, _) = started(ts, options("h-journal-epoch-two")).await;
        let b = c.attach(&second, &s).await;
        assert!(b.attached);
        assert_eq!(b.launched, department::LaunchMode::Restore);
        assert!(b.journal_epoch > a.journal_epoch, "{a:?} then {b:?}");
        assert!(b.observation.lease_epoch > a.observation.lease_epoch);
        let two = c.send(&second, &s, input("two")).await;
        assert_eq!(attempt_epoch(&two).await, b.journal_epoch);
        // A repeated attach takes nothing and reports the same residency.
        let again = c.attach(&second, &s).await;
        assert!(!again.attached);
        assert_eq!(
            (again.observation.lease_epoch, again.journal_epoch),
            (b.observation.lease_epoch, b.journal_epoch)
        );
        second.stop().await;
    }

    pub async fn a_claim_held_live_by_another_token_blocks_the_stream_until_it_lapses_and_is_then_retaken(
        ts: &TestStore,
    ) {
        use host::failpoints::{self, Action, steps};
        let host = format!("h-claim-held-{}", uuid::Uuid::now_v7().simple());
        let (svc, _) = started(ts, options(&host)).await;
        let c = Controller::new(ts);
        let s = c.session().await;
        let a = c.attach(&svc, &s).await;
        // The consumer holds after its claim of the first command, long enough for a claim
        // by another token to land on the second.
        let key = format!("{host}:{}", steps::AFTER_CLAIM);
        failpoints::arm(&key, Action::Delay(Duration::from_millis(800)));
        let first = c.send(&svc, &s, input("first")).await;
        wait_until("the consumer to hold", || failpoints::hits(&key) > 0).await;
        let held = c.admit(&s, input("claimed elsewhere")).await;
        let behind = c.admit(&s, input("behind it")).await;
        let foreign = uuid::Uuid::now_v7();
        c.store
            .claim(ClaimRequest {
                tenant: s.tenant.clone(),
                session: s.session.clone(),
                command: held.command.clone(),
                epoch: a.observation.lease_epoch,
                token: foreign,
                ttl: Duration::from_secs(4),
                expected_revision: held.revision,
            })
            .await
            .unwrap();
        svc.deliver(&s.tenant, &s.session).unwrap();
        assert_eq!(c.terminal(&s, &first).await.outcome, Some(Outcome::Applied));
        wait_until("the stream to block on the live claim", || {
            svc.command_blocked(&s.tenant, &s.session) == Some(true)
        })
        .await;
        let read = async |cmd: &CommandRecord| {
            c.store
                .command(&s.tenant, &s.session, &cmd.command)
                .await
                .unwrap()
        };
        assert_eq!(read(&behind).await.state, CommandState::Pending);
        assert_eq!(
            read(&held).await.claim.map(|c| c.token),
            Some(foreign),
            "the other claim stands while it is live"
        );
        // It lapses (the heartbeat keeps this Host's lease meanwhile); a pass takes it again.
        for _ in 0..25 {
            ts.advance(Duration::from_millis(200)).await;
            if ts.backend == sessionstore::testing::TestBackend::Sqlite {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        let done = c.terminal(&s, &held).await;
        assert_eq!(done.outcome, Some(Outcome::Applied), "{done:?}");
        assert_ne!(done.claim.map(|c| c.token), Some(foreign));
        assert_eq!(
            c.terminal(&s, &behind).await.outcome,
            Some(Outcome::Applied)
        );
        assert_eq!(svc.command_blocked(&s.tenant, &s.session), Some(false));
        c.check_exactly_once(&s).await;
        svc.stop().await;
    }

    pub async fn a_malformed_body_is_rejected_before_any_attempt(ts: &TestStore) {
        let (svc, _) = started(ts, options("h-malformed")).await;
        let c = Controller::new(ts);
        let s = c.session().await;
        c.attach(&svc, &s).await;
        let bad = c
            .admit_raw(
                &s,
                CommandKind::Input,
                CommandBody::Inline(br#"{"version":1,"text":42}"#.to_vec()),
            )
            .await;
        let next = c.send(&svc, &s, input("after")).await;
        let bad = c.terminal(&s, &bad).await;
        assert_eq!(
            (bad.state, bad.outcome),
            (CommandState::Rejected, Some(Outcome::Rejected))
        );
        assert!(bad.attempt.is_none(), "rejected while no attempt existed");
        assert_eq!(c.terminal(&s, &next).await.outcome, Some(Outcome::Applied));
        svc.stop().await;
    }

    pub async fn a_gate_answer_naming_another_gate_version_is_rejected_before_any_attempt(
        ts: &TestStore,
    ) {
        let (svc, rocket) = started(ts, options("h-gate-version")).await;
        let c = Controller::new(ts);
        let s = c.session().await;
        c.attach(&svc, &s).await;
        c.send(&svc, &s, input("/tool launch_rocket {}")).await;
        let gate = c.open_gate(&s).await;
        let projected = c.store.gates(&s.tenant, &s.session, true).await.unwrap();
        let seq = projected[0].opened_seq;
        let stale = CommandBodyV1::GateResponse(sessionstore::wire::GateAnswer {
            gate_id: gate,
            action: "approve".into(),
            text: None,
            expected_gate_seq: Some(seq + 100),
        });
        let bad = c.send(&svc, &s, stale).await;
        let bad = c.terminal(&s, &bad).await;
        assert_eq!(bad.outcome, Some(Outcome::Rejected), "{bad:?}");
        assert!(bad.attempt.is_none());
        let good = CommandBodyV1::GateResponse(sessionstore::wire::GateAnswer {
            gate_id: gate,
            action: "approve".into(),
            text: None,
            expected_gate_seq: Some(seq),
        });
        let ok = c.send(&svc, &s, good).await;
        assert_eq!(c.terminal(&s, &ok).await.outcome, Some(Outcome::Applied));
        c.wait_events(&s, "the tool result", |e| count(e, "turn_done") == 1)
            .await;
        assert_eq!(rocket.runs.load(Ordering::SeqCst), 1);
        svc.stop().await;
    }

    pub async fn an_unknown_version_body_blocks_the_stream_visibly(ts: &TestStore) {
        let (svc, _) = started(ts, options("h-blocked")).await;
        let c = Controller::new(ts);
        let s = c.session().await;
        c.attach(&svc, &s).await;
        let future = c
            .admit_raw(
                &s,
                CommandKind::Input,
                CommandBody::Inline(br#"{"version":2,"text":"from the future"}"#.to_vec()),
            )
            .await;
        let behind = c.send(&svc, &s, input("behind it")).await;
        wait_until("the blocked gauge", || {
            metric(&svc, "host_sessions_command_blocked") == 1.0
        })
        .await;
        let f = c
            .store
            .command(&s.tenant, &s.session, &future.command)
            .await
            .unwrap();
        assert_eq!(
            f.state,
            CommandState::Claimed,
            "blocked: claimed, no attempt, nothing written"
        );
        assert!(f.attempt.is_none());
        let b = c
            .store
            .command(&s.tenant, &s.session, &behind.command)
            .await
            .unwrap();
        assert_eq!(
            b.state,
            CommandState::Pending,
            "a pending predecessor is never skipped"
        );
        svc.stop().await;
    }

    pub async fn two_hosts_racing_to_attach_one_session_have_one_winner(ts: &TestStore) {
        let (a, _) = started(ts, options("h-race-a")).await;
        let (b, _) = started(ts, options("h-race-b")).await;
        let c = Controller::new(ts);
        let s = c.session().await;
        let (ra, rb) = tokio::join!(
            a.attach(c.attach_request(&s)),
            b.attach(c.attach_request(&s))
        );
        let (winner, loser, lost) = match (ra, rb) {
            (Ok(w), Err(e)) => (w, &b, e),
            (Err(e), Ok(w)) => (w, &a, e),
            other => panic!("expected exactly one winner: {other:?}"),
        };
        assert_eq!(
            lost,
            HostError::EpochMismatch {
                current_lease_epoch: Some(winner.observation.lease_epoch.0)
            }
        );
        // The loser wrote nothing: the registration and the lease are the winner's.
        let reg = c
            .store
            .registration(&s.tenant, &s.session)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(reg.host, winner.observation.host);
        assert!(loser.residents().is_empty());
        let lease = c
            .store
            .residency(&s.tenant, &s.session)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(lease.epoch, winner.observation.lease_epoch);
        assert_eq!(lease.epoch, ResidencyEpoch(1));
        a.stop().await;
        b.stop().await;
    }

    pub async fn an_idle_session_is_warm_released_and_restored_by_its_next_command(ts: &TestStore) {
        let mut o = options("h-warm");
        o.warm_ttl = Duration::from_millis(400);
        let (svc, _) = started(ts, o).await;
        let c = Controller::new(ts);
        let s = c.session().await;
        c.attach(&svc, &s).await;
        let first = c.send(&svc, &s, input("one")).await;
        c.terminal(&s, &first).await;
        wait_until("the warm release", || svc.residents().is_empty()).await;
        let reg = c
            .store
            .registration(&s.tenant, &s.session)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(reg.residency, ResidencyState::Released);
        let lease = c
            .store
            .residency(&s.tenant, &s.session)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(lease.holder, None, "the lease was given back");
        assert_eq!(metric(&svc, "host_admission_weight_consumed"), 0.0);
        // The next command re-places the session: restore, and it applies.
        let second = c.admit(&s, input("two")).await;
        let a = c.attach(&svc, &s).await;
        assert_eq!(a.launched, department::LaunchMode::Restore);
        assert_eq!(a.observation.lease_epoch, ResidencyEpoch(2));
        assert_eq!(
            c.terminal(&s, &second).await.outcome,
            Some(Outcome::Applied)
        );
        c.wait_events(&s, "both replies", |e| count(e, "turn_done") == 2)
            .await;
        svc.stop().await;
    }

    /// A session waiting at an open gate is never warm-released, however long it waits, while
    /// an idle session beside it goes once its countdown ends.
    pub async fn a_session_with_an_open_gate_is_never_warm_released(ts: &TestStore) {
        let mut o = options("h-warm-gated");
        o.warm_ttl = Duration::from_secs(1);
        let (svc, _) = started(ts, o).await;
        let c = Controller::new(ts);
        let gated = c.session().await;
        c.attach(&svc, &gated).await;
        c.send(&svc, &gated, input("/tool launch_rocket {}")).await;
        let idle = c.session().await;
        c.attach(&svc, &idle).await;
        let i = c.send(&svc, &idle, input("quiet")).await;
        c.terminal(&idle, &i).await;
        c.open_gate(&gated).await;
        wait_until("the idle session's warm release", || {
            svc.residents().len() == 1
        })
        .await;
        // Five countdowns more: the gated session is still resident.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let key = host::SessionKey {
            tenant: gated.tenant.clone(),
            session: gated.session.clone(),
        };
        assert_eq!(svc.residents(), vec![key]);
        svc.stop().await;
    }

    /// A dedicated Host keeps its fixed session resident when it is idle: it never
    /// warm-releases.
    pub async fn a_dedicated_host_never_warm_releases_its_fixed_session(ts: &TestStore) {
        let c = Controller::new(ts);
        let s = c.session().await;
        let mut o = options("h-warm-dedicated");
        o.warm_ttl = Duration::from_millis(300);
        o.placement = Placement::Dedicated;
        o.capacity = 1;
        o.fixed_session = Some(s.session.clone());
        let (svc, _) = started(ts, o).await;
        c.attach(&svc, &s).await;
        let i = c.send(&svc, &s, input("quiet")).await;
        c.terminal(&s, &i).await;
        // Five countdowns: a pooled Host would have released it by now.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(svc.residents().len(), 1);
        svc.stop().await;
    }

    /// An explicit restore of a session whose journal holds no conversation is refused
    /// `runtime_unavailable` and leaves nothing behind (no resident, the lease given back), so a
    /// wrong storage binding or a lost journal is seen, not papered over; a create then starts
    /// the conversation, and once there is one a restore restores it.
    pub async fn an_explicit_restore_with_no_conversation_is_refused_and_only_a_create_creates(
        ts: &TestStore,
    ) {
        let (svc, _) = started(ts, options("h-restore-empty")).await;
        let c = Controller::new(ts);
        let s = c.session().await;
        let mut restore = c.attach_request(&s);
        restore.mode = department::LaunchMode::Restore;
        match svc.attach(restore.clone()).await {
            Err(e @ HostError::RuntimeUnavailable(_)) => {
                assert_eq!(e.code(), Some("runtime_unavailable"));
                assert!(e.to_string().contains("restore_without_state"), "{e}");
            }
            Err(other) => panic!("refused otherwise: {other}"),
            Ok(a) => panic!("an empty journal was restored as {:?}", a.launched),
        }
        assert!(
            svc.residents().is_empty(),
            "the refused restore left a resident"
        );
        let lease = c
            .store
            .residency(&s.tenant, &s.session)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(lease.holder, None, "the refused restore kept the lease");
        let created = c.attach(&svc, &s).await;
        assert_eq!(created.launched, department::LaunchMode::Create);
        let first = c.send(&svc, &s, input("one")).await;
        c.terminal(&s, &first).await;
        svc.stop().await;
        let (svc, _) = started(ts, options("h-restore-full")).await;
        let restored = svc
            .attach(restore)
            .await
            .expect("a restore of a conversation");
        assert_eq!(restored.launched, department::LaunchMode::Restore);
        svc.stop().await;
    }

    pub async fn a_released_session_leaves_nothing_keyed_by_it_behind(ts: &TestStore) {
        let mut o = options("h-footprint");
        o.warm_ttl = Duration::from_millis(1500);
        let (svc, _) = started(ts, o).await;
        let c = Controller::new(ts);
        let mut sessions = Vec::new();
        for _ in 0..3 {
            sessions.push(c.session().await);
        }
        for round in 0..2 {
            let mut inputs = Vec::new();
            for s in &sessions {
                inputs.push(c.admit(s, input(&format!("round {round}"))).await);
                c.attach(&svc, s).await;
            }
            // Only a watched session holds a live-feed buffer.
            let watched = svc.subscribe(&sessions[0].tenant, &sessions[0].session);
            let fp = svc.footprint();
            assert_eq!(
                (fp.residents, fp.admission_charges, fp.relay_buffers),
                (3, 3, 1),
                "round {round}: {fp:?}"
            );
            drop(watched);
            for (s, i) in sessions.iter().zip(&inputs) {
                assert_eq!(c.terminal(s, i).await.outcome, Some(Outcome::Applied));
            }
            wait_until("every session warm-released", || svc.residents().is_empty()).await;
            assert_eq!(
                svc.footprint(),
                host::Footprint::default(),
                "round {round}: released sessions must leave nothing behind"
            );
        }
        svc.stop().await;
    }

    pub async fn an_attach_its_caller_stops_waiting_for_still_ends_and_the_session_serves(
        ts: &TestStore,
    ) {
        // Failpoints are process-wide: each backend's case arms its own Host id.
        let id = format!("h-abandoned-attach-{:?}", ts.backend).to_lowercase();
        let (svc, _) = started(ts, options(&id)).await;
        let c = Controller::new(ts);
        let s = c.session().await;
        let first = c.admit(&s, input("first")).await;
        // The attach is held just after its residency lease is granted, and its caller gives up
        // there (a link that went away, a timeout).
        host::failpoints::arm(
            &format!("{id}:{}", host::failpoints::steps::ATTACH_AFTER_LEASE),
            host::failpoints::Action::Delay(Duration::from_millis(400)),
        );
        let abandoned =
            tokio::time::timeout(Duration::from_millis(100), svc.attach(c.attach_request(&s)))
                .await;
        assert!(
            abandoned.is_err(),
            "the attach was still held: {abandoned:?}"
        );
        // The attach went on without its caller: the session becomes resident under the lease
        // it took, rather than leaving the lease held by nobody.
        wait_until("the abandoned attach to finish", || {
            !svc.residents().is_empty()
        })
        .await;
        assert_eq!(c.terminal(&s, &first).await.outcome, Some(Outcome::Applied));
        let again = c.attach(&svc, &s).await;
        assert!(!again.attached, "already resident: {again:?}");
        assert_eq!(again.observation.lease_epoch, ResidencyEpoch(1));
        let second = c.send(&svc, &s, input("second")).await;
        assert_eq!(
            c.terminal(&s, &second).await.outcome,
            Some(Outcome::Applied)
        );
        svc.stop().await;
    }

    pub async fn an_attach_that_panics_gives_back_its_lease_and_its_charge_and_the_next_attach_serves(
        ts: &TestStore,
    ) {
        // Failpoints are process-wide: each backend's case arms its own Host id.
        let id = format!("h-panicked-attach-{:?}", ts.backend).to_lowercase();
        let mut o = options(&id);
        o.capacity = 1;
        let (svc, _) = started(ts, o).await;
        let c = Controller::new(ts);
        let s = c.session().await;
        let first = c.admit(&s, input("first")).await;
        // A defect panics the attach once its residency lease is granted.
        host::failpoints::arm(
            &format!("{id}:{}", host::failpoints::steps::ATTACH_AFTER_LEASE),
            host::failpoints::Action::Panic,
        );
        let panicked = svc.attach(c.attach_request(&s)).await;
        assert!(
            matches!(&panicked, Err(host::HostError::Internal { .. })),
            "{panicked:?}"
        );
        // This Host's heartbeat renews every lease its generation holds: a lease the panicked
        // attach kept would pin the session here, resident nowhere, for as long as the Host
        // lives. It is given back instead.
        eventually("the lease to be given back", async || {
            let lease = c.store.residency(&s.tenant, &s.session).await.unwrap();
            let holder = lease.and_then(|l| l.holder);
            check(holder.is_none(), || format!("still held by {holder:?}"))
        })
        .await;
        // The admission charge came back too (the Host offers a weight of one), so the next
        // attach is admitted and serves.
        let again = c.attach(&svc, &s).await;
        assert!(again.attached, "{again:?}");
        assert_eq!(c.terminal(&s, &first).await.outcome, Some(Outcome::Applied));
        c.check_exactly_once(&s).await;
        svc.stop().await;
    }

    pub async fn a_warm_release_whose_lease_release_failed_gives_the_lease_back_on_a_retry(
        ts: &TestStore,
    ) {
        // Failpoints are process-wide: each backend's case arms its own Host id.
        let id = format!("h-release-retry-{:?}", ts.backend).to_lowercase();
        let mut o = options(&id);
        o.warm_ttl = Duration::from_millis(300);
        let (svc, _) = started(ts, o).await;
        let c = Controller::new(ts);
        let s = c.session().await;
        // The store refuses the warm release's lease release once, as if it were away.
        let step = format!("{id}:{}", host::failpoints::steps::RELEASE_LEASE);
        host::failpoints::arm(&step, host::failpoints::Action::Fail(1));
        let first = c.admit(&s, input("one")).await;
        c.attach(&svc, &s).await;
        assert_eq!(c.terminal(&s, &first).await.outcome, Some(Outcome::Applied));
        wait_until("the warm release", || svc.residents().is_empty()).await;
        assert_eq!(
            host::failpoints::hits(&step),
            1,
            "the release was refused once"
        );
        // This Host's heartbeat renews every lease its generation holds, so a lease left
        // behind would pin the session for as long as the Host lives: it is given back on a
        // retry instead.
        eventually("the lease to be given back", async || {
            let lease = c.store.residency(&s.tenant, &s.session).await.unwrap();
            let holder = lease.and_then(|l| l.holder);
            check(holder.is_none(), || format!("still held by {holder:?}"))
        })
        .await;
        let second = c.admit(&s, input("two")).await;
        let again = c.attach(&svc, &s).await;
        assert_eq!(again.launched, department::LaunchMode::Restore);
        assert_eq!(
            c.terminal(&s, &second).await.outcome,
            Some(Outcome::Applied)
        );
        svc.stop().await;
    }

    pub async fn a_command_arriving_during_a_warm_release_aborts_it(ts: &TestStore) {
        let mut o = options("h-warm-abort");
        o.warm_ttl = Duration::from_millis(300);
        // Passes are rare, so the admitted command sits in the inbox when the TTL fires.
        o.reconcile_interval = Duration::from_secs(30);
        o.claim_ttl = Duration::from_secs(40);
        let (svc, _) = started(ts, o).await;
        let c = Controller::new(ts);
        let s = c.session().await;
        c.attach(&svc, &s).await;
        let cmd = c.admit(&s, input("just in time")).await; // no delivery: no hint
        assert_eq!(c.terminal(&s, &cmd).await.outcome, Some(Outcome::Applied));
        assert_eq!(
            svc.residents().len(),
            1,
            "the release was aborted; the session stayed"
        );
        svc.stop().await;
    }

    pub async fn drain_releases_idle_sessions_abandons_gated_ones_at_once_and_busy_ones_as_failed_steps(
        ts: &TestStore,
    ) {
        let (svc, _) = started(ts, options("h-drain")).await;
        let c = Controller::new(ts);
        let idle = c.session().await;
        let gated = c.session().await;
        let busy = c.session().await;
        for s in [&idle, &gated, &busy] {
            c.attach(&svc, s).await;
        }
        let i = c.send(&svc, &idle, input("quiet")).await;
        c.terminal(&idle, &i).await;
        c.send(&svc, &gated, input("/tool launch_rocket {}")).await;
        let gate = c.open_gate(&gated).await;
        let words = vec!["w"; 2000].join(" ");
        let mut feed = svc.subscribe(&busy.tenant, &busy.session).unwrap();
        c.send(&svc, &busy, input(&format!("/slow 50 {words}")))
            .await;
        streaming(&mut feed).await;
        assert!(svc.ready());
        let report = svc.drain().await;
        assert!(!svc.ready(), "readyz is false once a drain begins");
        assert!(svc.live(), "healthz stays true until stop completes");
        let key = |s: &SessionRecord| host::SessionKey {
            tenant: s.tenant.clone(),
            session: s.session.clone(),
        };
        assert!(report.released.contains(&key(&idle)), "{report:?}");
        assert!(report.abandoned.contains(&key(&gated)), "{report:?}");
        assert!(report.abandoned.contains(&key(&busy)), "{report:?}");
        assert!(report.parked.is_empty());
        // A turn still running past the idle bound is a refused (crash-equivalent) release, a
        // failed step; a session parked at its gate is abandoned at once and is no failure.
        let refused: Vec<_> = report
            .failures
            .iter()
            .filter(|f| f.step == host::drain_steps::RELEASE_RUNTIME)
            .filter_map(|f| f.session.clone())
            .collect();
        assert_eq!(refused, [key(&busy)], "{report:?}");
        assert!(
            !report
                .failures
                .iter()
                .any(|f| f.session.as_ref() == Some(&key(&gated))),
            "{report:?}"
        );
        assert!(!report.is_clean());
        assert_eq!(report.state, hostlink::records::DrainState::Drained);
        assert_eq!(report.generation, svc.generation());
        assert!(svc.residents().is_empty());
        // The gate stays open and answerable on a successor.
        let (next, rocket) = started(ts, options("h-drain-successor")).await;
        let a = c.attach(&next, &gated).await;
        assert_eq!(a.launched, department::LaunchMode::Restore);
        let ans = c.send(&next, &gated, answer(gate, "approve", None)).await;
        assert_eq!(
            c.terminal(&gated, &ans).await.outcome,
            Some(Outcome::Applied)
        );
        c.wait_events(&gated, "the approved tool", |e| count(e, "turn_done") == 1)
            .await;
        assert_eq!(rocket.runs.load(Ordering::SeqCst), 1);
        svc.stop().await;
        next.stop().await;
    }

    /// A gate open for hours must not hold up a rollout: a drain gives a gated session up at
    /// once (well inside the idle boundary), reports it abandoned and the drain clean, and the
    /// gate is answerable on the next Host.
    pub async fn a_drain_gives_up_a_gated_session_at_once_and_stays_clean(ts: &TestStore) {
        let mut o = options("h-drain-gated");
        o.idle_boundary = Duration::from_secs(20);
        o.drain_grace = Duration::from_secs(30);
        let (svc, _) = started(ts, o).await;
        let c = Controller::new(ts);
        let gated = c.session().await;
        c.attach(&svc, &gated).await;
        c.send(&svc, &gated, input("/tool launch_rocket {}")).await;
        let gate = c.open_gate(&gated).await;
        let began = std::time::Instant::now();
        let report = svc.drain().await;
        let took = began.elapsed();
        assert!(
            took < Duration::from_secs(10),
            "the drain waited {took:?} on a gated session (idle boundary 20 s)"
        );
        let key = host::SessionKey {
            tenant: gated.tenant.clone(),
            session: gated.session.clone(),
        };
        assert_eq!(report.abandoned, [key], "{report:?}");
        assert!(report.failures.is_empty(), "{report:?}");
        assert!(report.is_clean(), "{report:?}");
        svc.stop().await;
        let (next, rocket) = started(ts, options("h-drain-gated-next")).await;
        c.attach(&next, &gated).await;
        let ans = c.send(&next, &gated, answer(gate, "approve", None)).await;
        assert_eq!(
            c.terminal(&gated, &ans).await.outcome,
            Some(Outcome::Applied)
        );
        c.wait_events(&gated, "the approved tool", |e| count(e, "turn_done") == 1)
            .await;
        assert_eq!(rocket.runs.load(Ordering::SeqCst), 1);
        next.stop().await;
    }

    pub async fn a_lost_lease_abandons_the_session_and_credits_capacity(ts: &TestStore) {
        let (svc, _) = started(ts, options("h-lost")).await;
        let c = Controller::new(ts);
        let s = c.session().await;
        c.attach(&svc, &s).await;
        let i = c.send(&svc, &s, input("before")).await;
        c.terminal(&s, &i).await;
        // As after a freeze past the Host's expiry: its run of heartbeats ends, and another
        // holder takes the lease row meanwhile.
        ts.exec_raw("UPDATE host_targets SET beat_expires_at = 1 WHERE host_id = 'h-lost'")
            .await;
        ts.exec_raw(&format!(
            "UPDATE residency_leases SET epoch = epoch + 1, holder = 'thief' WHERE session_id = '{}'",
            s.session
        ))
        .await;
        wait_until("the lost residency to end", || svc.residents().is_empty()).await;
        assert_eq!(metric(&svc, "host_admission_weight_consumed"), 0.0);
        // Re-attachable once the thief's lease lapses (it never renews).
        ts.exec_raw(&format!(
            "UPDATE residency_leases SET holder = NULL, expires_at = NULL WHERE session_id = '{}'",
            s.session
        ))
        .await;
        let a = c.attach(&svc, &s).await;
        assert_eq!(a.observation.lease_epoch, ResidencyEpoch(3));
        let after = c.send(&svc, &s, input("after")).await;
        assert_eq!(c.terminal(&s, &after).await.outcome, Some(Outcome::Applied));
        svc.stop().await;
    }

    pub async fn a_journal_write_failure_abandons_the_session_and_a_successor_restores_it(
        ts: &TestStore,
    ) {
        let (svc, _) = started(ts, options("h-fault")).await;
        let c = Controller::new(ts);
        let s = c.session().await;
        c.attach(&svc, &s).await;
        let i = c.send(&svc, &s, input("before")).await;
        c.terminal(&s, &i).await;
        // Someone takes the journal over: the runtime's next write fails and latches a fault.
        c.store
            .journal_acquire(
                &s.tenant,
                s.binding.runtime_session_id,
                "intruder",
                Duration::from_secs(60),
            )
            .await
            .unwrap();
        let during = c.send(&svc, &s, input("during")).await;
        wait_until("the faulted residency to end", || {
            svc.residents().is_empty()
        })
        .await;
        assert_eq!(metric(&svc, "host_admission_weight_consumed"), 0.0);
        let reg = c
            .store
            .registration(&s.tenant, &s.session)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(reg.residency, ResidencyState::Released, "tombstoned");
        // The controller re-places it: the command in flight ends honestly, later ones apply.
        c.attach(&svc, &s).await;
        let d = c.terminal(&s, &during).await;
        assert!(
            matches!(d.outcome, Some(Outcome::Applied | Outcome::NotApplied)),
            "{d:?}"
        );
        let after = c.send(&svc, &s, input("after")).await;
        assert_eq!(c.terminal(&s, &after).await.outcome, Some(Outcome::Applied));
        c.check_exactly_once(&s).await;
        svc.stop().await;
    }

    pub async fn the_metrics_registry_exports_every_named_series(ts: &TestStore) {
        let (svc, _) = started(ts, options("h-metrics")).await;
        let c = Controller::new(ts);
        let s = c.session().await;
        c.attach(&svc, &s).await;
        let i = c.send(&svc, &s, input("m")).await;
        c.terminal(&s, &i).await;
        // The apply latency is observed just after the settle the store shows: wait for it.
        eventually("the apply to be observed", async || {
            if svc
                .metrics()
                .render()
                .contains("host_command_apply_seconds")
            {
                Ok(())
            } else {
                Err("not yet".to_string())
            }
        })
        .await;
        let text = svc.metrics().render();
        for name in [
            "host_sessions",
            "host_sessions_gate_waiting",
            "host_sessions_command_blocked",
            "host_admission_weight_consumed",
            "host_admission_weight_capacity",
            "host_command_lag",
            "host_command_queue_depth",
            "host_release_failures_total",
            "host_attach_seconds",
            "host_command_apply_seconds",
        ] {
            assert!(text.contains(name), "{name} missing from\n{text}");
        }
        assert_eq!(metric(&svc, "host_admission_weight_capacity"), 16.0);
        assert_eq!(metric(&svc, "host_admission_weight_consumed"), 1.0);
        // Readiness as /readyz gives it: ready, and every reason exported at 0; a drain turns
        // ready off and says why.
        let draining = r#"host_not_ready{reason="draining"}"#;
        assert_eq!(metric(&svc, "host_ready"), 1.0);
        for code in host::readiness::REASON_CODES {
            let series = format!(r#"host_not_ready{{reason="{code}"}}"#);
            assert_eq!(metric(&svc, &series), 0.0, "{series}");
        }
        svc.drain().await;
        assert_eq!(metric(&svc, "host_ready"), 0.0);
        assert_eq!(metric(&svc, draining), 1.0);
        svc.stop().await;
    }
}

sessionstore::both_backends!(cases =>
    create_with_a_first_message_is_applied_and_the_reply_is_journaled,
    input_interrupt_and_gate_responses_settle_from_the_runtime,
    a_body_stored_by_reference_is_dereferenced_and_verified,
    a_referenced_body_above_the_hosts_cap_is_rejected_before_any_attempt,
    a_malformed_body_is_rejected_before_any_attempt,
    a_failed_mapping_read_is_retried_and_the_live_tail_skips_nothing,
    a_refused_publication_drops_the_sessions_routes_and_the_tail_goes_on,
    every_attempt_carries_the_journal_epoch_its_runtime_reports_and_the_attach_reports_it,
    a_gate_change_whose_hint_the_publisher_lost_is_published_from_where_it_folded,
    a_gate_publisher_whose_mark_a_successor_fenced_stops_and_ends_the_residency,
    a_gate_answer_under_a_mark_that_is_not_this_hosts_grant_holds_the_whole_stream_writing_nothing,
    a_claim_held_live_by_another_token_blocks_the_stream_until_it_lapses_and_is_then_retaken,
    a_live_tail_that_falls_behind_drops_the_sessions_routes_and_goes_on_at_journal_offsets,
    reference_shaped_bodies_apply_and_one_contradicting_its_admission_is_rejected,
    an_unknown_version_body_blocks_the_stream_visibly,
    a_gate_answer_naming_another_gate_version_is_rejected_before_any_attempt,
    two_hosts_racing_to_attach_one_session_have_one_winner,
    an_idle_session_is_warm_released_and_restored_by_its_next_command,
    a_command_arriving_during_a_warm_release_aborts_it,
    an_attach_its_caller_stops_waiting_for_still_ends_and_the_session_serves,
    a_warm_release_whose_lease_release_failed_gives_the_lease_back_on_a_retry,
    an_attach_that_panics_gives_back_its_lease_and_its_charge_and_the_next_attach_serves,
    a_released_session_leaves_nothing_keyed_by_it_behind,
    an_explicit_restore_with_no_conversation_is_refused_and_only_a_create_creates,
    drain_releases_idle_sessions_abandons_gated_ones_at_once_and_busy_ones_as_failed_steps,
    a_drain_gives_up_a_gated_session_at_once_and_stays_clean,
    a_session_with_an_open_gate_is_never_warm_released,
    a_dedicated_host_never_warm_releases_its_fixed_session,
    a_lost_lease_abandons_the_session_and_credits_capacity,
    a_journal_write_failure_abandons_the_session_and_a_successor_restores_it,
    the_metrics_registry_exports_every_named_series,
);
