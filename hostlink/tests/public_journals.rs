//! The cache of warm public journal readers, over a real store (SQLite and PostgreSQL): a
//! session read again is served by its kept reader, the least recently used reader is dropped
//! at capacity, and a reader is never reused for another binding.

mod cases {
    use hostlink::public_journal::PublicJournals;
    use sessionstore::testing::TestStore;
    use sessionstore::*;

    fn binding() -> SessionBinding {
        SessionBinding {
            runtime_session_id: RuntimeSessionId::mint(),
            storage_binding_id: local_binding(),
            binding_version: 1,
        }
    }

    pub async fn a_kept_reader_serves_the_next_page_and_the_least_recent_is_dropped(
        ts: &TestStore,
    ) {
        let journals = PublicJournals::new(2);
        let tenant = TenantId::new("acme").unwrap();
        let (a, b, c) = (
            SessionId::new("a").unwrap(),
            SessionId::new("b").unwrap(),
            SessionId::new("c").unwrap(),
        );
        let (ba, bb, bc) = (binding(), binding(), binding());
        let read = async |s: &SessionId, bind: &SessionBinding| {
            journals
                .page(&ts.store, &tenant, s, bind, 0, None, 10)
                .await
                .unwrap()
        };
        assert!(read(&a, &ba).await.events.is_empty());
        assert_eq!(journals.hits(), 0);
        read(&a, &ba).await;
        assert_eq!(journals.hits(), 1, "the second read reused the kept reader");
        read(&b, &bb).await;
        read(&c, &bc).await;
        assert_eq!(journals.len(), 2, "at most the capacity is kept");
        read(&a, &ba).await;
        assert_eq!(journals.hits(), 1, "a was the least recent and was dropped");
        read(&c, &bc).await;
        assert_eq!(journals.hits(), 2);
        // Another binding under the same names never gets the kept reader.
        read(&c, &binding()).await;
        assert_eq!(journals.hits(), 2);
    }
}

sessionstore::both_backends!(cases =>
    a_kept_reader_serves_the_next_page_and_the_least_recent_is_dropped,
);
