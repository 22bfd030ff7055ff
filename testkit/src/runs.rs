//! Runs recorded straight into a store, for a test that needs a listing longer than a page
//! without driving each run through a Host.

use std::time::Duration;

use sessionstore::{NewRun, RunEnd, RunId, Store, StoreOptions, TenantId};

/// The program every recorded run names (one step that sleeps for no time).
const PROGRAM: &str = "steps:\n  - name: only\n    sleep: 0s\n";

/// Records `n` completed runs of `tenant`, `{prefix}-0000` on, oldest first (created one
/// after another; equal creation times list in id order, so the order is the same).
pub async fn completed_runs(store: &Store, tenant: &str, prefix: &str, n: usize) {
    for i in 0..n {
        let created = store
            .create_run(NewRun {
                run_id: RunId::new(format!("{prefix}-{i:04}")).expect("a run id"),
                tenant: TenantId::new(tenant).expect("a tenant id"),
                source: PROGRAM.into(),
                input: "{}".into(),
                holder: "recorded/attempt-1".into(),
                fencing_token: format!("{prefix}-{i}"),
                lease: Duration::from_secs(3600),
                idempotency_key: None,
                pins: Vec::new(),
                started_by: None,
                trace: None,
            })
            .await
            .expect("a recorded run");
        store
            .end_run(&created.status.fence(), RunEnd::Completed)
            .await
            .expect("the recorded run ends");
    }
}

/// [`completed_runs`] in the store at `url`, blocking: it runs on a runtime of its own, so a
/// test thread that is not async (or a `spawn_blocking` one) can call it.
pub fn record_completed_runs(url: &str, tenant: &str, prefix: &str, n: usize) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let store = Store::open(StoreOptions::new(url.to_owned()))
            .await
            .expect("the store opens");
        completed_runs(&store, tenant, prefix, n).await;
        store.close().await;
    });
}
