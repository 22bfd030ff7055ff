//! A Host's life in its order, on SQLite and PostgreSQL: a composition validates its options
//! before it opens any store and asks its registrar once; start writes the first advertisement
//! before it returns (a refused one fails the start) and the heartbeat renews it after.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use department::Registration;
use host::Registrar;
use sessionstore::Store;
use testkit::HarnessRegistrar;

/// The harness registrar, counting how often it is asked.
struct Counting {
    calls: Arc<AtomicUsize>,
}

#[async_trait::async_trait]
impl Registrar for Counting {
    async fn register(&self, store: &Store) -> Result<Vec<Registration>, String> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        HarnessRegistrar {
            rocket: Default::default(),
        }
        .register(store)
        .await
    }
}

mod cases {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use host::HostError;
    use sessionstore::testing::{TestBackend, TestStore};
    use sessionstore::*;
    use testkit::*;

    use super::Counting;

    pub async fn the_registrar_is_asked_once_at_composition_and_never_again(ts: &TestStore) {
        let calls = Arc::new(AtomicUsize::new(0));
        let svc = host::Composition {
            options: options("h-registrar-once"),
            store: ts.options(),
            registrar: Box::new(Counting {
                calls: calls.clone(),
            }),
            profile: department::RuntimeProfile::Durable,
            version: "test".into(),
        }
        .build()
        .await
        .unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        let agents: Vec<AgentId> = svc.department().agents().cloned().collect();
        svc.start().await.unwrap();
        let c = Controller::new(ts);
        for _ in 0..2 {
            let s = c.session().await;
            c.attach(&svc, &s).await;
            let i = c.send(&svc, &s, input("hello")).await;
            assert_eq!(c.terminal(&s, &i).await.outcome, Some(Outcome::Applied));
        }
        svc.stop().await;
        assert_eq!(
            calls.load(Ordering::SeqCst),
            1,
            "asked once, at composition"
        );
        let after: Vec<AgentId> = svc.department().agents().cloned().collect();
        assert_eq!(after, agents, "the registrar's result is unchanged");
    }

    pub async fn start_returns_with_the_advertisement_written_and_the_heartbeat_renews_it(
        ts: &TestStore,
    ) {
        let host = HostId::new("h-advertised").unwrap();
        let svc = compose(ts, options(host.as_str()), Default::default()).await;
        assert!(ts.store.target(&host).await.unwrap().is_none());
        svc.start().await.unwrap();
        // Read at once: no wait for a heartbeat.
        let first = ts
            .store
            .target(&host)
            .await
            .unwrap()
            .expect("the advertisement is written before start returns");
        assert_eq!(first.generation, svc.generation());
        assert!(first.accepting);
        let heartbeat = options(host.as_str()).registry_heartbeat;
        eventually("a heartbeat to renew the advertisement", async || {
            ts.advance(heartbeat).await;
            if ts.backend == TestBackend::Sqlite {
                tokio::time::sleep(heartbeat).await;
            }
            let now = ts.store.target(&host).await.map_err(|e| e.to_string())?;
            let now = now.ok_or("gone")?;
            check(
                now.observed_at_ms > first.observed_at_ms
                    && now.expires_at_ms > first.expires_at_ms,
                || format!("{now:?} after {first:?}"),
            )
        })
        .await;
        svc.stop().await;
    }

    pub async fn a_refused_first_advertisement_fails_start_and_the_host_takes_no_session(
        ts: &TestStore,
    ) {
        let svc = compose(ts, options("h-refused-advert"), Default::default()).await;
        // The store refuses every advertisement.
        match ts.backend {
            TestBackend::Sqlite => {
                ts.exec_raw(
                    "CREATE TRIGGER refuse_adverts BEFORE INSERT ON host_targets \
                     BEGIN SELECT RAISE(ABORT, 'advertisements refused'); END;",
                )
                .await
            }
            TestBackend::Postgres => {
                ts.exec_raw(
                    "CREATE FUNCTION refuse_adverts() RETURNS trigger LANGUAGE plpgsql AS \
                     $$ BEGIN RAISE EXCEPTION 'advertisements refused'; END $$; \
                     CREATE TRIGGER refuse_adverts BEFORE INSERT OR UPDATE ON host_targets \
                     FOR EACH ROW EXECUTE FUNCTION refuse_adverts();",
                )
                .await
            }
        }
        let e = svc.start().await.unwrap_err();
        assert!(e.to_string().contains("first advertisement"), "{e}");
        assert!(!svc.ready());
        let c = Controller::new(ts);
        let s = c.session().await;
        assert_eq!(
            svc.attach(c.attach_request(&s)).await.unwrap_err(),
            HostError::NotStarted
        );
        let lease = ts.store.residency(&s.tenant, &s.session).await.unwrap();
        assert!(
            lease.as_ref().is_none_or(|l| l.holder.is_none()),
            "{lease:?}"
        );
        svc.stop().await;
    }
}

sessionstore::both_backends!(cases =>
    the_registrar_is_asked_once_at_composition_and_never_again,
    start_returns_with_the_advertisement_written_and_the_heartbeat_renews_it,
    a_refused_first_advertisement_fails_start_and_the_host_takes_no_session,
);

/// Options are checked before any store is opened: an invalid composition leaves no SQLite
/// file behind and never dials PostgreSQL (an unreachable one does not change the refusal).
#[tokio::test]
async fn an_invalid_composition_is_refused_before_any_store_is_opened() {
    let dir = std::env::temp_dir().join(format!("host-invalid-{}", uuid::Uuid::now_v7()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("never.db");
    for url in [
        format!("sqlite://{}", file.display()),
        "postgres://postgres@127.0.0.1:1/never".to_owned(),
    ] {
        let mut options = testkit::options("h-invalid");
        options.host_id = None;
        let e = host::Composition {
            options,
            store: sessionstore::StoreOptions::new(url.clone()),
            registrar: Box::new(Counting {
                calls: Arc::new(AtomicUsize::new(0)),
            }),
            profile: department::RuntimeProfile::Durable,
            version: "test".into(),
        }
        .build()
        .await
        .map(|_| ())
        .unwrap_err();
        assert!(
            matches!(e, host::CompositionError::Options(_)),
            "{url}: {e}"
        );
    }
    assert!(!file.exists(), "no SQLite file was created");
    std::fs::remove_dir_all(&dir).unwrap();
}
