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
