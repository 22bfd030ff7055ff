//! The fleet's rows, on SQLite and PostgreSQL alike: a Host's one heartbeat keeps every lease
//! it holds alive (and never one it lost) at a cost that does not grow with them, expired advertisements are collected without a
//! generation ever repeating, one reconciler leads at a time and a deposed one cannot assign,
//! and the reconciler's scan finds exactly the sessions with work and no live residency.

mod cases {
    use std::time::Duration;

    use sessionstore::testing::TestStore;
    use sessionstore::*;

    const LONG: Duration = Duration::from_secs(30);
    const SHORT: Duration = Duration::from_millis(300);
    const PAST_SHORT: Duration = Duration::from_millis(450);

    fn tenant() -> TenantId {
        TenantId::new("acme").unwrap()
    }

    fn host(name: &str) -> HostId {
        HostId::new(name).unwrap()
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

    async fn admit(ts: &TestStore, s: &SessionRecord, id: &str) -> CommandRecord {
        ts.store
            .admit(NewCommand {
                tenant: s.tenant.clone(),
                session: s.session.clone(),
                command: CommandId::new(id).unwrap(),
                kind: CommandKind::Input,
                body: CommandBody::Inline(b"{\"text\":\"hi\"}".to_vec()),
                principal: None,
                metadata: None,
                apply_within: Duration::from_secs(3600),
                trace: None,
            })
            .await
            .unwrap()
    }

    async fn reside(
        ts: &TestStore,
        s: &SessionRecord,
        on: &str,
        generation: u64,
        ttl: Duration,
    ) -> ResidencyGrant {
        ts.store
            .acquire_residency(ResidencyRequest {
                tenant: s.tenant.clone(),
                session: s.session.clone(),
                holder: format!("{on}/{generation}/{}", s.session),
                host: host(on),
                host_generation: generation,
                ttl,
            })
            .await
            .unwrap()
    }

    fn heartbeat(on: &str, generation: u64, ttl: Duration) -> HostHeartbeat {
        HostHeartbeat {
            advertisement: HostAdvertisement {
                host: host(on),
                endpoint: format!("ws://{on}:7400"),
                placement: Placement::Pooled,
                isolation_class: "shared".into(),
                capacity: 64,
                accepting: true,
                generation,
                ttl,
            },
            weight_used: 3,
            retention: Duration::from_secs(1),
        }
    }

    fn leader(holder: &str, ttl: Duration) -> LeadershipRequest {
        LeadershipRequest {
            name: "fleet".into(),
            holder: holder.into(),
            ttl,
        }
    }

    pub async fn one_heartbeat_renews_every_live_lease_of_its_host_in_one_commit(ts: &TestStore) {
        let mut grants = Vec::new();
        for i in 0..40 {
            let s = new_session(ts, &format!("s{i}")).await;
            grants.push(reside(ts, &s, "h1", 1, Duration::from_secs(3)).await);
        }
        let other = new_session(ts, "elsewhere").await;
        let foreign = reside(ts, &other, "h2", 1, Duration::from_secs(3)).await;
        let before = ts.store.stats();
        let report = ts.store.heartbeat(heartbeat("h1", 1, LONG)).await.unwrap();
        let spent = ts.store.stats().since(&before);
        assert_eq!(spent.commits, 1, "one durable write, whatever the number");
        // The first beat of a generation begins a run: it reads the leases it carries, once.
        let renewed = report.renewed.expect("a new run reads what it carries");
        assert_eq!(renewed.len(), 40);
        assert!(renewed.iter().all(|r| r.session != other.session));
        assert_eq!(report.target.weight_used, 3);
        ts.advance(Duration::from_millis(1000)).await;
        // The next beat carries the run on: it neither reads nor writes a lease.
        let before = ts.store.stats();
        let report = ts.store.heartbeat(heartbeat("h1", 1, LONG)).await.unwrap();
        let spent = ts.store.stats().since(&before);
        assert_eq!(report.renewed, None);
        assert_eq!(spent.commits, 1);
        ts.advance(Duration::from_millis(2200)).await;
        // Every lease of h1 outlived its own TTL; h2's lapsed.
        for g in &grants {
            let lease = ts
                .store
                .residency(&g.tenant, &g.session)
                .await
                .unwrap()
                .unwrap();
            assert_eq!(lease.epoch, g.epoch);
            assert_eq!(lease.expires_at_ms, Some(report.target.expires_at_ms));
        }
        let now = ts.store.now_ms().await.unwrap();
        let lapsed = ts
            .store
            .residency(&foreign.tenant, &foreign.session)
            .await
            .unwrap()
            .unwrap();
        assert!(!lapsed.is_live(now));
    }

    pub async fn a_heartbeat_never_revives_a_lapsed_lease_nor_one_another_host_took(
        ts: &TestStore,
    ) {
        let lapsed = new_session(ts, "lapsed").await;
        let taken = new_session(ts, "taken").await;
        reside(ts, &lapsed, "h1", 1, SHORT).await;
        reside(ts, &taken, "h1", 1, SHORT).await;
        ts.advance(PAST_SHORT).await;
        let successor = reside(ts, &taken, "h2", 1, LONG).await;
        assert_eq!(successor.epoch, ResidencyEpoch(2));
        let report = ts.store.heartbeat(heartbeat("h1", 1, LONG)).await.unwrap();
        assert_eq!(report.renewed, Some(Vec::new()));
        let now = ts.store.now_ms().await.unwrap();
        let l = ts
            .store
            .residency(&lapsed.tenant, &lapsed.session)
            .await
            .unwrap()
            .unwrap();
        assert!(!l.is_live(now));
        let t = ts
            .store
            .residency(&taken.tenant, &taken.session)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(t.host, Some(host("h2")));
        assert_eq!(t.expires_at_ms, Some(successor.expires_at_ms));
    }

    pub async fn a_heartbeat_of_an_older_generation_is_refused_and_renews_nothing(ts: &TestStore) {
        let s = new_session(ts, "s").await;
        let g = reside(ts, &s, "h1", 1, SHORT).await;
        ts.store.heartbeat(heartbeat("h1", 2, LONG)).await.unwrap();
        let err = ts
            .store
            .heartbeat(heartbeat("h1", 1, LONG))
            .await
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::Epoch);
        assert_eq!(err.mark(), Some(2));
        let lease = ts
            .store
            .residency(&g.tenant, &g.session)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(lease.expires_at_ms, Some(g.expires_at_ms));
    }

    pub async fn a_heartbeat_refreshes_its_registrations_only(ts: &TestStore) {
        let mine = new_session(ts, "mine").await;
        let theirs = new_session(ts, "theirs").await;
        for (s, on) in [(&mine, "h1"), (&theirs, "h2")] {
            let g = reside(ts, s, on, 1, LONG).await;
            ts.store
                .put_registration(RegistrationUpdate {
                    tenant: s.tenant.clone(),
                    session: s.session.clone(),
                    host: host(on),
                    host_generation: 1,
                    endpoint: format!("ws://{on}:7400"),
                    residency: ResidencyState::Resident,
                    accepting: true,
                    lease_epoch: g.epoch,
                    ttl: SHORT,
                })
                .await
                .unwrap();
        }
        let report = ts.store.heartbeat(heartbeat("h1", 1, LONG)).await.unwrap();
        let reg = |s: &SessionRecord| {
            let (t, s) = (s.tenant.clone(), s.session.clone());
            let store = ts.store.clone();
            async move { store.registration(&t, &s).await.unwrap().unwrap() }
        };
        assert_eq!(reg(&mine).await.expires_at_ms, report.target.expires_at_ms);
        assert!(reg(&theirs).await.expires_at_ms < report.target.expires_at_ms);
    }

    pub async fn expired_advertisements_are_collected_and_an_id_never_reuses_a_generation(
        ts: &TestStore,
    ) {
        let s = new_session(ts, "s").await;
        reside(ts, &s, "gone", 7, SHORT).await;
        let mut old = heartbeat("gone", 5, SHORT);
        old.retention = SHORT;
        ts.store.heartbeat(old).await.unwrap();
        assert_eq!(
            ts.store.next_host_generation(&host("gone")).await.unwrap(),
            8
        );
        // Not yet expired for longer than the retention: kept.
        let mut keeping = heartbeat("h1", 1, LONG);
        keeping.retention = Duration::from_secs(600);
        let report = ts.store.heartbeat(keeping).await.unwrap();
        assert_eq!(report.collected, 0);
        ts.advance(Duration::from_millis(1500)).await;
        let report = ts.store.heartbeat(heartbeat("h1", 1, LONG)).await.unwrap();
        assert_eq!(report.collected, 1);
        let ids: Vec<HostId> = ts
            .store
            .targets(false)
            .await
            .unwrap()
            .into_iter()
            .map(|t| t.host)
            .collect();
        assert_eq!(ids, vec![host("h1")]);
        // The lease the old incarnation left still names generation 7.
        assert_eq!(
            ts.store.next_host_generation(&host("gone")).await.unwrap(),
            8
        );
        assert_eq!(
            ts.store.next_host_generation(&host("new")).await.unwrap(),
            1
        );
    }

    pub async fn a_heartbeat_costs_the_same_statements_at_three_leases_and_at_three_hundred(
        ts: &TestStore,
    ) {
        let mut spent = Vec::new();
        for (on, n) in [("small", 3), ("large", 300)] {
            for i in 0..n {
                let s = new_session(ts, &format!("{on}-{i}")).await;
                reside(ts, &s, on, 1, LONG).await;
            }
            ts.store.heartbeat(heartbeat(on, 1, LONG)).await.unwrap();
            ts.advance(Duration::from_millis(100)).await;
            let before = ts.store.stats();
            let report = ts.store.heartbeat(heartbeat(on, 1, LONG)).await.unwrap();
            assert_eq!(report.renewed, None);
            spent.push(ts.store.stats().since(&before).statements);
        }
        assert_eq!(
            spent[0], spent[1],
            "statements of a beat at 3 and at 300 leases"
        );
    }

    pub async fn a_beat_after_its_run_lapsed_carries_only_leases_still_live_on_their_own(
        ts: &TestStore,
    ) {
        let carried = new_session(ts, "carried").await;
        let fresh = new_session(ts, "fresh").await;
        let g = reside(ts, &carried, "h1", 1, SHORT).await;
        let run = ts.store.heartbeat(heartbeat("h1", 1, SHORT)).await.unwrap();
        // Kept alive by the run past its own expiry...
        ts.advance(Duration::from_millis(200)).await;
        let report = ts.store.heartbeat(heartbeat("h1", 1, SHORT)).await.unwrap();
        assert_eq!(report.renewed, None);
        ts.advance(Duration::from_millis(200)).await;
        let now = ts.store.now_ms().await.unwrap();
        assert!(now > g.expires_at_ms && now > run.target.expires_at_ms);
        let lease = ts
            .store
            .residency(&carried.tenant, &carried.session)
            .await
            .unwrap()
            .unwrap();
        assert!(lease.is_live(now));
        assert_eq!(lease.expires_at_ms, Some(report.target.expires_at_ms));
        // ...then the Host is frozen past the run's expiry; a new lease is acquired meanwhile.
        ts.advance(PAST_SHORT).await;
        let young = reside(ts, &fresh, "h1", 1, LONG).await;
        let lapsed_at = report.target.expires_at_ms;
        let thawed = ts.store.heartbeat(heartbeat("h1", 1, LONG)).await.unwrap();
        let renewed: Vec<SessionId> = thawed
            .renewed
            .expect("a beat after a lapse begins a new run")
            .into_iter()
            .map(|r| r.session)
            .collect();
        assert_eq!(renewed, vec![fresh.session.clone()]);
        let now = ts.store.now_ms().await.unwrap();
        let lease = ts
            .store
            .residency(&carried.tenant, &carried.session)
            .await
            .unwrap()
            .unwrap();
        assert!(!lease.is_live(now), "the thaw revived a lapsed lease");
        assert_eq!(
            lease.expires_at_ms,
            Some(lapsed_at),
            "it reads as the run left it"
        );
        let young_lease = ts
            .store
            .residency(&fresh.tenant, &fresh.session)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(young_lease.epoch, young.epoch);
        assert_eq!(young_lease.expires_at_ms, Some(thawed.target.expires_at_ms));
    }

    pub async fn a_new_generation_leaves_the_old_ones_leases_as_its_last_beat_left_them(
        ts: &TestStore,
    ) {
        let s = new_session(ts, "s").await;
        let g = reside(ts, &s, "h1", 1, SHORT).await;
        let last = ts.store.heartbeat(heartbeat("h1", 1, LONG)).await.unwrap();
        ts.advance(PAST_SHORT).await;
        ts.store.heartbeat(heartbeat("h1", 2, LONG)).await.unwrap();
        let lease = ts
            .store
            .residency(&s.tenant, &s.session)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(lease.epoch, g.epoch);
        assert_eq!(lease.host_generation, Some(1));
        assert_eq!(lease.expires_at_ms, Some(last.target.expires_at_ms));
        // Still the old incarnation's until that expiry: nobody else may take it yet.
        let err = ts
            .store
            .acquire_residency(ResidencyRequest {
                tenant: s.tenant.clone(),
                session: s.session.clone(),
                holder: "h2/1/x".into(),
                host: host("h2"),
                host_generation: 1,
                ttl: LONG,
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::ClaimHeld);
    }

    pub async fn one_reconciler_leads_at_a_time_and_a_deposed_one_cannot_assign(ts: &TestStore) {
        let s = new_session(ts, "s").await;
        let cmd = admit(ts, &s, "c1").await;
        let a = ts
            .store
            .acquire_leadership(leader("a", SHORT))
            .await
            .unwrap();
        assert_eq!(a.epoch, 1);
        let err = ts
            .store
            .acquire_leadership(leader("b", SHORT))
            .await
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::ClaimHeld);
        let renewed = ts
            .store
            .acquire_leadership(leader("a", SHORT))
            .await
            .unwrap();
        assert_eq!(renewed.epoch, 1);
        ts.advance(PAST_SHORT).await;
        let b = ts
            .store
            .acquire_leadership(leader("b", LONG))
            .await
            .unwrap();
        assert_eq!(b.epoch, 2);
        let assign = |l: &Leadership| PlacementRequest {
            tenant: s.tenant.clone(),
            session: s.session.clone(),
            host: host("h1"),
            host_generation: 1,
            leadership: l.clone(),
            ttl: LONG,
        };
        let err = ts
            .store
            .assign_placement(assign(&a), cmd.command.clone())
            .await
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::Epoch);
        assert_eq!(err.mark(), Some(2));
        let p = ts
            .store
            .assign_placement(assign(&b), cmd.command.clone())
            .await
            .unwrap();
        assert_eq!(p.leader_epoch, 2);
        ts.store.release_leadership(&b).await.unwrap();
        let err = ts
            .store
            .assign_placement(assign(&b), cmd.command.clone())
            .await
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::ClaimLost);
        let c = ts
            .store
            .acquire_leadership(leader("c", LONG))
            .await
            .unwrap();
        assert_eq!(c.epoch, 3);
    }

    pub async fn the_scan_finds_sessions_with_open_work_and_no_live_residency_nor_assignment(
        ts: &TestStore,
    ) {
        let orphan = new_session(ts, "orphan").await;
        let resident = new_session(ts, "resident").await;
        let idle = new_session(ts, "idle").await;
        let c = admit(ts, &orphan, "c1").await;
        admit(ts, &resident, "c1").await;
        reside(ts, &resident, "h1", 1, LONG).await;
        let _ = idle;
        let found = ts.store.orphans(100).await.unwrap();
        assert_eq!(
            found,
            vec![Orphan {
                tenant: tenant(),
                session: orphan.session.clone(),
                command: c.command.clone(),
            }]
        );
        assert_eq!(
            ts.store.sessions_with_work(&host("h1"), 1).await.unwrap(),
            vec![(tenant(), resident.session.clone())]
        );
        assert!(
            ts.store
                .sessions_with_work(&host("h1"), 2)
                .await
                .unwrap()
                .is_empty()
        );

        let l = ts
            .store
            .acquire_leadership(leader("a", LONG))
            .await
            .unwrap();
        let req = |s: &SessionRecord, ttl| PlacementRequest {
            tenant: s.tenant.clone(),
            session: s.session.clone(),
            host: host("h2"),
            host_generation: 4,
            leadership: l.clone(),
            ttl,
        };
        // A session resident somewhere is never assigned.
        let err = ts
            .store
            .assign_placement(req(&resident, LONG), c.command.clone())
            .await
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::ClaimHeld);
        let mut hints = ts.store.admissions();
        ts.store
            .assign_placement(req(&orphan, SHORT), c.command.clone())
            .await
            .unwrap();
        let hint = tokio::time::timeout(Duration::from_secs(5), hints.recv())
            .await
            .expect("an assignment announces a wake-up")
            .unwrap();
        assert_eq!(hint.session, orphan.session);
        assert!(ts.store.orphans(100).await.unwrap().is_empty());
        let mine = ts.store.placements_for(&host("h2"), 4).await.unwrap();
        assert_eq!(mine.len(), 1);
        assert_eq!(mine[0].session, orphan.session);
        assert!(
            ts.store
                .placements_for(&host("h2"), 3)
                .await
                .unwrap()
                .is_empty()
        );
        let loads = ts.store.host_loads().await.unwrap();
        let load = |h: &str| loads.iter().find(|l| l.host == Some(host(h))).cloned();
        assert_eq!(load("h1").map(|l| (l.sessions, l.placing)), Some((1, 0)));
        assert_eq!(load("h2").map(|l| (l.sessions, l.placing)), Some((0, 1)));
        assert_eq!(load("h1").map(|l| l.tenants), Some(vec![tenant()]));
        // An assignment nobody acts on lapses, and the session is found again.
        ts.advance(PAST_SHORT).await;
        assert_eq!(ts.store.orphans(100).await.unwrap().len(), 1);
        // Acting on it clears it; clearing another Host's assignment does nothing.
        ts.store
            .assign_placement(req(&orphan, LONG), c.command.clone())
            .await
            .unwrap();
        assert!(
            !ts.store
                .clear_placement(&tenant(), &orphan.session, &host("h1"))
                .await
                .unwrap()
        );
        assert!(
            ts.store
                .clear_placement(&tenant(), &orphan.session, &host("h2"))
                .await
                .unwrap()
        );
        assert_eq!(ts.store.orphans(100).await.unwrap().len(), 1);
    }

    pub async fn the_first_request_to_drain_an_incarnation_is_the_one_kept(ts: &TestStore) {
        let a = host("host-a");
        assert_eq!(ts.store.drain_request(&a, 1).await.unwrap(), None);
        let first = ts
            .store
            .record_drain(&a, 1, "operator:alice")
            .await
            .unwrap();
        assert_eq!(first.requested_by, "operator:alice");
        assert_eq!((first.host.as_str(), first.generation), ("host-a", 1));
        // A repeat (the drain is idempotent) joins the first and changes nothing.
        let again = ts
            .store
            .record_drain(&a, 1, "signal:SIGTERM")
            .await
            .unwrap();
        assert_eq!(again, first);
        assert_eq!(
            ts.store.drain_request(&a, 1).await.unwrap(),
            Some(first.clone())
        );
        // The next incarnation is asked afresh; another Host is its own.
        let next = ts
            .store
            .record_drain(&a, 2, "signal:SIGTERM")
            .await
            .unwrap();
        assert_eq!(next.requested_by, "signal:SIGTERM");
        assert_eq!(
            ts.store.drain_request(&host("host-b"), 1).await.unwrap(),
            None
        );
        let all = ts.store.drain_requests(Some(&a)).await.unwrap();
        assert_eq!(
            all.iter()
                .map(|d| (d.generation, d.requested_by.as_str()))
                .collect::<Vec<_>>(),
            vec![(2, "signal:SIGTERM"), (1, "operator:alice")]
        );
        ts.store
            .record_drain(&host("host-b"), 4, "tenant:acme")
            .await
            .unwrap();
        let every = ts.store.drain_requests(None).await.unwrap();
        assert_eq!(every.len(), 3);
        assert!(
            every
                .iter()
                .any(|d| d.host.as_str() == "host-b" && d.requested_by == "tenant:acme")
        );
        for (generation, by) in [(0, "x"), (3, "")] {
            let err = ts.store.record_drain(&a, generation, by).await.unwrap_err();
            assert_eq!(err.code(), ErrorCode::Invalid, "{err}");
        }
    }
}

sessionstore::both_backends!(cases =>
    the_first_request_to_drain_an_incarnation_is_the_one_kept,
    one_heartbeat_renews_every_live_lease_of_its_host_in_one_commit,
    a_heartbeat_never_revives_a_lapsed_lease_nor_one_another_host_took,
    a_heartbeat_of_an_older_generation_is_refused_and_renews_nothing,
    a_heartbeat_refreshes_its_registrations_only,
    a_heartbeat_costs_the_same_statements_at_three_leases_and_at_three_hundred,
    a_beat_after_its_run_lapsed_carries_only_leases_still_live_on_their_own,
    a_new_generation_leaves_the_old_ones_leases_as_its_last_beat_left_them,
    expired_advertisements_are_collected_and_an_id_never_reuses_a_generation,
    one_reconciler_leads_at_a_time_and_a_deposed_one_cannot_assign,
    the_scan_finds_sessions_with_open_work_and_no_live_residency_nor_assignment,
);
