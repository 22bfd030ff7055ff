//! SQLite reads run on the store's own fixed reader threads, never on the runtime's blocking
//! pool (whose thread count ratchets up under a steady stream of short jobs, each new thread
//! bringing a stack and an allocator arena a long-running Host keeps).

use std::time::Duration;

use sessionstore::{ErrorCode, SessionId, Store, StoreOptions, TenantId};

#[test]
fn sqlite_reads_are_answered_while_the_runtimes_blocking_pool_is_exhausted() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .max_blocking_threads(1)
        .enable_all()
        .build()
        .expect("a runtime");
    let dir = tempfile::tempdir().expect("a temporary directory");
    let url = format!("sqlite://{}", dir.path().join("store.db").display());
    rt.block_on(async {
        let store = Store::open(StoreOptions::new(url))
            .await
            .expect("the store opens");
        // The one blocking thread is taken until the reads are done.
        let (release, held) = std::sync::mpsc::channel::<()>();
        let blocker = tokio::task::spawn_blocking(move || held.recv());
        let tenant = TenantId::new("t").unwrap();
        let reads = (0..32).map(|i| {
            let store = store.clone();
            let tenant = tenant.clone();
            async move {
                store
                    .session(&tenant, &SessionId::new(format!("s{i}")).unwrap())
                    .await
            }
        });
        let answers =
            tokio::time::timeout(Duration::from_secs(10), futures::future::join_all(reads)).await;
        release.send(()).expect("the blocker waits");
        let answers = answers.expect("reads must not wait for the runtime's blocking pool");
        for a in answers {
            let e = a.expect_err("no such session");
            assert_eq!(e.code(), ErrorCode::NotFound, "{e}");
        }
        blocker.await.expect("the blocker ends").expect("released");
        store.close().await;
    });
}

#[test]
fn each_sqlite_connection_caches_at_most_the_pages_its_option_allows() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let dir = tempfile::tempdir().expect("a temporary directory");
    let url = format!("sqlite://{}", dir.path().join("store.db").display());
    rt.block_on(async {
        let defaults = Store::open(StoreOptions::new(url.clone()))
            .await
            .expect("the store opens");
        assert_eq!(
            defaults.sqlite_cache_kib_for_tests().await.expect("read"),
            Some((2048, 256)),
            "by default the writer keeps 2 MiB and each reader 256 KiB"
        );
        defaults.close().await;
        let mut options = StoreOptions::new(url.clone());
        options.sqlite_writer_cache_kib = 1024;
        options.sqlite_reader_cache_kib = 96;
        let store = Store::open(options).await.expect("the store opens");
        assert_eq!(
            store.sqlite_cache_kib_for_tests().await.expect("read"),
            Some((1024, 96))
        );
        store.close().await;
        for (writer, reader) in [(32, 256), (2048, 0), (2 * 1024 * 1024, 256)] {
            let mut options = StoreOptions::new(url.clone());
            options.sqlite_writer_cache_kib = writer;
            options.sqlite_reader_cache_kib = reader;
            let e = Store::open(options)
                .await
                .expect_err("a cache bound outside 64 KiB to 1 GiB is refused");
            assert_eq!(e.code(), ErrorCode::Invalid, "{e}");
        }
    });
}
