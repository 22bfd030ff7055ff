//! What a drain tells the operator, read from the Host's own log (`testkit::log_capture`), on
//! SQLite and PostgreSQL: a drain that fails the same step for many sessions logs the first
//! few one by one and then one count per step, never a line per session (a large Host may fail
//! tens of thousands), while its report still holds every failure.

mod cases {
    use sessionstore::testing::TestStore;
    use testkit::log_capture::{capture, lines_with};
    use testkit::*;

    pub async fn a_drain_that_fails_a_step_for_many_sessions_logs_the_first_few_and_then_one_count(
        ts: &TestStore,
    ) {
        capture();
        let busy = host::FAILURES_LOGGED_ONE_BY_ONE + 5;
        let (svc, _) = started(
            ts,
            host::Options {
                capacity: 32,
                ..options("h-drain-logs")
            },
        )
        .await;
        let c = Controller::new(ts);
        let words = vec!["w"; 2000].join(" ");
        let mut sessions = Vec::new();
        for _ in 0..busy {
            let s = c.session().await;
            c.attach(&svc, &s).await;
            let mut feed = svc.subscribe(&s.tenant, &s.session).unwrap();
            c.send(&svc, &s, input(&format!("/slow 50 {words}"))).await;
            streaming(&mut feed).await;
            sessions.push(s);
        }
        let report = svc.drain().await;
        // Every turn still ran past the idle bound: a refused release for each, all in the
        // report.
        let refused = report
            .failures
            .iter()
            .filter(|f| f.step == host::drain_steps::RELEASE_RUNTIME)
            .count();
        assert_eq!(refused, busy, "{report:?}");
        assert_eq!(
            report.failures_by_step(),
            [(host::drain_steps::RELEASE_RUNTIME, busy)]
        );
        // At most the first few are logged one by one at ERROR (the test's sessions are its
        // own: other tests of this binary log other ids)...
        let one_by_one = sessions
            .iter()
            .flat_map(|s| lines_with(s.session.as_str()))
            .filter(|l| l.contains("ERROR") && l.contains("drain step failed"))
            .count();
        assert!(
            (1..=host::FAILURES_LOGGED_ONE_BY_ONE).contains(&one_by_one),
            "{one_by_one} per-session ERROR lines"
        );
        // ...and the drain ends with one count for the step.
        let summary = lines_with(&format!("failures={busy}"));
        assert!(
            summary
                .iter()
                .any(|l| l.contains("ERROR") && l.contains("step=\"release_runtime\"")),
            "{summary:#?}"
        );
        svc.stop().await;
    }
}

sessionstore::both_backends!(cases =>
    a_drain_that_fails_a_step_for_many_sessions_logs_the_first_few_and_then_one_count,
);
