//! A Host in a fleet, on SQLite and PostgreSQL: one heartbeat write keeps all its residencies
//! alive, a residency whose lease another Host took while this one was frozen is ended at the
//! next heartbeat, and a
//! session the fleet reconciler assigned to this Host is attached and its admitted command
//! applied with no client action.

mod cases {
    use std::time::Duration;

    use ::fleet::{Reconciler, ReconcilerOptions};
    use sessionstore::testing::TestStore;
    use sessionstore::*;

    use testkit::*;

    pub async fn one_heartbeat_write_keeps_every_resident_session_alive(ts: &TestStore) {
        let (svc, _) = started(ts, options("h-beat")).await;
        let c = Controller::new(ts);
        let mut sessions = Vec::new();
        for _ in 0..12 {
            let s = c.session().await;
            let a = c.attach(&svc, &s).await;
            sessions.push((s, a.observation.lease_epoch));
        }
        let heartbeat = options("h-beat").registry_heartbeat;
        let before = svc.store().stats();
        let started_at = std::time::Instant::now();
        // Longer than the registry expiry: every lease must have been renewed to survive it.
        for _ in 0..6 {
            ts.advance(heartbeat).await;
            if ts.backend == sessionstore::testing::TestBackend::Sqlite {
                tokio::time::sleep(heartbeat).await;
            }
        }
        let spent = svc.store().stats().since(&before);
        let beats = started_at.elapsed().as_millis() / heartbeat.as_millis() + 2;
        assert!(
            u128::from(spent.commits) <= beats,
            "{} commits for {beats} heartbeats and 12 idle sessions",
            spent.commits
        );
        let now = ts.store.now_ms().await.unwrap();
        for (s, epoch) in &sessions {
            assert_eq!(
                svc.residency(&s.tenant, &s.session).map(|r| r.0),
                Some(*epoch)
            );
            let lease = ts
                .store
                .residency(&s.tenant, &s.session)
                .await
                .unwrap()
                .unwrap();
            assert!(lease.is_live(now), "{lease:?} at {now}");
        }
        // Still applying commands.
        let i = c.send(&svc, &sessions[0].0, input("still here")).await;
        assert_eq!(
            c.terminal(&sessions[0].0, &i).await.outcome,
            Some(Outcome::Applied)
        );
        svc.stop().await;
    }

    pub async fn a_residency_whose_lease_another_host_took_while_it_was_frozen_ends_at_the_next_heartbeat(
        ts: &TestStore,
    ) {
        let (svc, _) = started(ts, options("h-robbed")).await;
        let c = Controller::new(ts);
        let kept = c.session().await;
        let taken = c.session().await;
        c.attach(&svc, &kept).await;
        c.attach(&svc, &taken).await;
        // As if this Host had been frozen past its expiry: its run of heartbeats ends, the
        // lease it carried lapses, and another Host takes it. (The kept one was, as the first
        // beat after a thaw finds a lease whose own expiry had not passed yet.)
        ts.exec_raw("UPDATE host_targets SET beat_expires_at = 1 WHERE host_id = 'h-robbed'")
            .await;
        ts.exec_raw(&format!(
            "UPDATE residency_leases SET expires_at = 1 WHERE session_id = '{}'",
            taken.session
        ))
        .await;
        ts.exec_raw(&format!(
            "UPDATE residency_leases SET expires_at = 9000000000000 WHERE session_id = '{}'",
            kept.session
        ))
        .await;
        let successor = ts
            .store
            .acquire_residency(ResidencyRequest {
                tenant: taken.tenant.clone(),
                session: taken.session.clone(),
                holder: "other-host/1/x".into(),
                host: HostId::new("other-host").unwrap(),
                host_generation: 1,
                ttl: Duration::from_secs(60),
            })
            .await
            .unwrap();
        assert_eq!(successor.epoch, ResidencyEpoch(2));
        wait_until("the robbed residency to end", || {
            svc.residency(&taken.tenant, &taken.session).is_none()
        })
        .await;
        assert!(svc.residency(&kept.tenant, &kept.session).is_some());
        // The successor's lease was not touched.
        let lease = ts
            .store
            .residency(&taken.tenant, &taken.session)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(lease.holder.as_deref(), Some("other-host/1/x"));
        assert_eq!(lease.expires_at_ms, Some(successor.expires_at_ms));
        svc.stop().await;
    }

    pub async fn a_session_assigned_to_this_host_is_attached_and_its_command_applied_unasked(
        ts: &TestStore,
    ) {
        let (svc, _) = started(ts, options("h-assigned")).await;
        let c = Controller::new(ts);
        let s = c.session().await;
        let create = c.admit(&s, input("hello")).await;
        // Nobody attaches it: the fleet reconciler finds it and assigns it to the only Host.
        let mut reconciler = Reconciler::new(
            ts.store.clone(),
            ReconcilerOptions {
                interval: Duration::from_millis(100),
                leader_ttl: Duration::from_secs(5),
                ..ReconcilerOptions::default()
            },
            "test",
        )
        .unwrap();
        let report = reconciler.pass().await.unwrap();
        assert_eq!(report.orphans, 1);
        assert_eq!(report.assigned.len(), 1);
        assert_eq!(report.assigned[0].host.as_str(), "h-assigned");
        let done = c.terminal(&s, &create).await;
        assert_eq!(done.outcome, Some(Outcome::Applied));
        assert!(svc.residency(&s.tenant, &s.session).is_some());
        // The assignment was acted on and cleared; nothing is left to place.
        eventually("the assignment to be cleared", async || {
            let left = ts
                .store
                .placements_for(&HostId::new("h-assigned").unwrap(), svc.generation())
                .await
                .map_err(|e| e.to_string())?;
            check(left.is_empty(), || format!("{left:?}"))
        })
        .await;
        assert_eq!(reconciler.pass().await.unwrap().orphans, 0);
        c.check_exactly_once(&s).await;
        svc.stop().await;
    }

    pub async fn a_pass_whose_time_under_its_leadership_is_up_defers_the_rest_instead_of_writing_on(
        ts: &TestStore,
    ) {
        let (svc, _) = started(ts, options("h-paced")).await;
        let c = Controller::new(ts);
        let mut waiting = Vec::new();
        for _ in 0..8 {
            let s = c.session().await;
            let command = c.admit(&s, input("hello")).await;
            waiting.push((s, command));
        }
        // A pass whose time under its leadership is up (a slow store, a busy machine) places
        // nothing more and says so, rather than writing on past its leadership.
        let options = ReconcilerOptions {
            name: "hasty".into(),
            ..ReconcilerOptions::default()
        };
        let leadership = ts
            .store
            .acquire_leadership(LeadershipRequest {
                name: options.name.clone(),
                holder: "hasty".into(),
                ttl: options.leader_ttl,
            })
            .await
            .unwrap();
        let report = ::fleet::reconcile_until(
            &ts.store,
            &leadership,
            &options,
            tokio::time::Instant::now(),
        )
        .await
        .unwrap();
        assert_eq!(report.orphans, 8, "{report:?}");
        assert!(report.assigned.is_empty(), "{report:?}");
        assert_eq!(report.deferred, 8, "{report:?}");
        // With time to act, a pass places them all.
        let mut patient = Reconciler::new(
            ts.store.clone(),
            ReconcilerOptions {
                name: "patient".into(),
                interval: Duration::from_millis(100),
                leader_ttl: Duration::from_secs(60),
                ..ReconcilerOptions::default()
            },
            "test",
        )
        .unwrap();
        let report = patient.pass().await.unwrap();
        assert_eq!(report.assigned.len(), 8, "{report:?}");
        for (s, command) in &waiting {
            let done = c.terminal(s, command).await;
            assert_eq!(done.outcome, Some(Outcome::Applied));
            c.check_exactly_once(s).await;
        }
        svc.stop().await;
    }
}

sessionstore::both_backends!(cases =>
    one_heartbeat_write_keeps_every_resident_session_alive,
    a_residency_whose_lease_another_host_took_while_it_was_frozen_ends_at_the_next_heartbeat,
    a_session_assigned_to_this_host_is_attached_and_its_command_applied_unasked,
    a_pass_whose_time_under_its_leadership_is_up_defers_the_rest_instead_of_writing_on,
);
