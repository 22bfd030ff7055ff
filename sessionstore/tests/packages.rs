//! Published runnable packages: every case runs against SQLite and PostgreSQL.

mod cases {
    use sessionstore::testing::TestStore;
    use sessionstore::*;

    fn package(version: &str, digest_byte: char, bytes: &[u8]) -> NewPackage {
        NewPackage {
            workspace: "shop".into(),
            name: "word-count".into(),
            version: version.into(),
            digest: format!("sha256:{}", digest_byte.to_string().repeat(64)),
            bytes: bytes.to_vec(),
        }
    }

    pub async fn a_release_is_recorded_once_and_the_same_digest_again_changes_nothing(
        ts: &TestStore,
    ) {
        let first = ts
            .store
            .publish_package(package("1.0.0", 'a', b"package bytes"))
            .await
            .unwrap();
        let Publication::Recorded(summary) = first else {
            panic!("{first:?}")
        };
        assert_eq!(summary.identity(), "shop/word-count@1.0.0");
        assert_eq!(summary.size, 13);
        let again = ts
            .store
            .publish_package(package("1.0.0", 'a', b"package bytes"))
            .await
            .unwrap();
        assert_eq!(again, Publication::Unchanged(summary.clone()));
        let stored = ts
            .store
            .package("shop", "word-count", "1.0.0")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(stored.bytes, b"package bytes");
        assert_eq!(stored.summary, summary);
    }

    pub async fn another_digest_for_a_recorded_release_is_a_conflict_and_keeps_the_first(
        ts: &TestStore,
    ) {
        ts.store
            .publish_package(package("1.0.0", 'a', b"first"))
            .await
            .unwrap();
        let second = ts
            .store
            .publish_package(package("1.0.0", 'b', b"second"))
            .await
            .unwrap();
        let Publication::Conflict { recorded } = second else {
            panic!("{second:?}")
        };
        assert_eq!(recorded.digest, format!("sha256:{}", "a".repeat(64)));
        let stored = ts
            .store
            .package("shop", "word-count", "1.0.0")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(stored.bytes, b"first");
    }

    pub async fn two_versions_coexist_and_list_in_order_without_bytes(ts: &TestStore) {
        for v in ["2.0.0", "1.0.0"] {
            ts.store
                .publish_package(package(v, 'c', v.as_bytes()))
                .await
                .unwrap();
        }
        let all = ts.store.packages().await.unwrap();
        let ids: Vec<String> = all.iter().map(|p| p.identity()).collect();
        assert_eq!(ids, ["shop/word-count@1.0.0", "shop/word-count@2.0.0"]);
        assert!(
            ts.store
                .package("shop", "word-count", "3.0.0")
                .await
                .unwrap()
                .is_none()
        );
    }

    pub async fn stored_bytes_that_were_altered_read_as_integrity(ts: &TestStore) {
        ts.store
            .publish_package(package("1.0.0", 'a', b"original"))
            .await
            .unwrap();
        let flip = match ts.backend {
            sessionstore::testing::TestBackend::Sqlite => {
                "UPDATE runnable_packages SET bytes = X'6f726967696e616c21'"
            }
            sessionstore::testing::TestBackend::Postgres => {
                "UPDATE runnable_packages SET bytes = '\\x6f726967696e616c21'::bytea"
            }
        };
        ts.exec_raw(flip).await;
        let err = ts
            .store
            .package("shop", "word-count", "1.0.0")
            .await
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::Integrity);
    }

    pub async fn bad_publish_input_is_refused_with_a_typed_error(ts: &TestStore) {
        let mut bad_name = package("1.0.0", 'a', b"x");
        bad_name.name = "a@b".into();
        let mut bad_digest = package("1.0.0", 'a', b"x");
        bad_digest.digest = "md5:abc".into();
        let empty = package("1.0.0", 'a', b"");
        for p in [bad_name, bad_digest, empty] {
            let err = ts.store.publish_package(p).await.unwrap_err();
            assert_eq!(err.code(), ErrorCode::Invalid, "{err}");
        }
        assert!(ts.store.packages().await.unwrap().is_empty());
    }

    pub async fn a_store_reopened_keeps_its_packages_and_its_schema(ts: &TestStore) {
        ts.store
            .publish_package(package("1.0.0", 'a', b"kept"))
            .await
            .unwrap();
        let again = ts.reopen().await.unwrap();
        let stored = again
            .package("shop", "word-count", "1.0.0")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(stored.bytes, b"kept");
    }
}

sessionstore::both_backends!(cases =>
    a_release_is_recorded_once_and_the_same_digest_again_changes_nothing,
    another_digest_for_a_recorded_release_is_a_conflict_and_keeps_the_first,
    two_versions_coexist_and_list_in_order_without_bytes,
    stored_bytes_that_were_altered_read_as_integrity,
    bad_publish_input_is_refused_with_a_typed_error,
    a_store_reopened_keeps_its_packages_and_its_schema,
);
