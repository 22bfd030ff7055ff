//! A run's handler never outlives the driver's hold on the run, over real stores (SQLite and
//! PostgreSQL) and real handler processes: a driver whose lease renewals hang stops its
//! handler (and the handler's grandchild) before the lease can lapse and records nothing; a
//! drive halted mid-invoke (a drain out of time) does the same; in both cases a successor
//! taking the run over afterwards runs the step again and completes the run.

mod cases {
    use std::collections::BTreeSet;
    use std::path::{Path, PathBuf};
    use std::sync::Arc;
    use std::time::Duration;

    use async_trait::async_trait;
    use runnable::Runner;
    use serde_json::json;
    use sessionstore::testing::TestStore;
    use sessionstore::*;
    use tokio::sync::Notify;
    use tokio_util::sync::CancellationToken;
    use workflow::{
        DriveEnd, DriveError, Driver, DriverOptions, NoEvents, RunJournal, StartRefusal,
        StoreReleases, WorkspaceRunnables, pin_new_run,
    };

    /// Its first attempt starts a grandchild, writes both pids to the folder its input names
    /// and waits; any later attempt (the pid file exists) succeeds at once.
    const HOLD: &str = r#"#!/bin/sh
request=$(cat)
dir=$(printf '%s' "$request" | sed -n 's/.*"dir":"\([^"]*\)".*/\1/p')
if [ -e "$dir/handler.pid" ]; then
  echo '{"ok":true,"output":{"attempt":"later"}}'
  exit 0
fi
sleep 1000 &
echo $! > "$dir/grandchild.pid"
echo $$ > "$dir/handler.pid.tmp"
mv "$dir/handler.pid.tmp" "$dir/handler.pid"
wait
"#;

    const DECLARATION: &str = "\
name: hold
version: 1.0.0
input:
  type: object
  properties:
    dir: {type: string}
  required: [dir]
output:
  type: object
  properties: {attempt: {type: string}}
  required: [attempt]
command: ./hold.sh
timeout: 60s
effect: idempotent
";

    const PROGRAM: &str = "\
steps:
  - name: hold
    invoke: hold@1.0.0
    input: {dir: \"${input.dir}\"}
";

    fn workspace(root: &Path) -> PathBuf {
        use std::os::unix::fs::PermissionsExt as _;
        let ws = root.join("shop");
        let dir = ws.join("runnables/hold");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("runnable.yaml"), DECLARATION).unwrap();
        let script = dir.join("hold.sh");
        std::fs::write(&script, HOLD).unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        ws
    }

    /// The store, except that lease renewals never answer (a store that went unreachable
    /// for the renewals; everything else still reaches it).
    struct HangingRenewals(Store);

    #[async_trait]
    impl RunJournal for HangingRenewals {
        async fn status(&self, run: &RunId) -> StoreResult<Option<RunStatus>> {
            RunJournal::status(&self.0, run).await
        }
        async fn program(&self, run: &RunId) -> StoreResult<Option<RunProgram>> {
            RunJournal::program(&self.0, run).await
        }
        async fn pins(&self, run: &RunId) -> StoreResult<Vec<RunPin>> {
            RunJournal::pins(&self.0, run).await
        }
        async fn pin(&self, fence: &RunFence, pins: Vec<RunPin>) -> StoreResult<Vec<RunPin>> {
            RunJournal::pin(&self.0, fence, pins).await
        }
        async fn journal(&self, run: &RunId) -> StoreResult<Vec<StepEntry>> {
            RunJournal::journal(&self.0, run).await
        }
        async fn checkpoints(&self, run: &RunId) -> StoreResult<Vec<Checkpoint>> {
            RunJournal::checkpoints(&self.0, run).await
        }
        async fn answers(&self, run: &RunId) -> StoreResult<Vec<RunAnswer>> {
            RunJournal::answers(&self.0, run).await
        }
        async fn append(&self, fence: &RunFence, entry: NewStepEntry) -> StoreResult<StepEntry> {
            RunJournal::append(&self.0, fence, entry).await
        }
        async fn arm(&self, fence: &RunFence, cp: NewCheckpoint) -> StoreResult<Checkpoint> {
            RunJournal::arm(&self.0, fence, cp).await
        }
        async fn end(&self, fence: &RunFence, how: RunEnd) -> StoreResult<RunStatus> {
            RunJournal::end(&self.0, fence, how).await
        }
        async fn renew(&self, _: &RunFence, _: Duration) -> StoreResult<Millis> {
            std::future::pending().await
        }
        async fn park(&self, fence: &RunFence, until: ParkUntil) -> StoreResult<bool> {
            RunJournal::park(&self.0, fence, until).await
        }
        async fn now_ms(&self) -> StoreResult<Millis> {
            RunJournal::now_ms(&self.0).await
        }
    }

    fn driver(store: &Store, journal: Arc<dyn RunJournal>, ws: &Path, lease: Duration) -> Driver {
        let runner = Runner::open(ws).unwrap();
        let releases = Arc::new(StoreReleases::new(
            store.clone(),
            Some(runner.clone()),
            &ws.join("host-state"),
        ));
        Driver {
            journal,
            env: Arc::new(WorkspaceRunnables {
                runner: Some(runner),
                agents: BTreeSet::new(),
            }),
            releases: releases.clone(),
            invoker: releases,
            agents: None,
            events: Arc::new(NoEvents),
            options: DriverOptions {
                lease,
                poll: Duration::from_millis(20),
                park: None,
            },
        }
    }

    /// Records a run held by `host-a` under `lease`, pinned as a Host's `run.start` pins it.
    async fn start(store: &Store, d: &Driver, id: &str, dir: &Path, lease: Duration) -> RunStatus {
        let pins = match pin_new_run(PROGRAM, d.env.as_ref(), d.releases.as_ref()).await {
            Ok(p) => p,
            Err(StartRefusal::Problems(p)) => panic!("{p:?}"),
            Err(StartRefusal::Release(e)) => panic!("{e}"),
        };
        store
            .create_run(NewRun {
                run_id: RunId::new(id).unwrap(),
                tenant: TenantId::new("acme").unwrap(),
                source: PROGRAM.into(),
                input: json!({ "dir": dir }).to_string(),
                holder: "host-a/1".into(),
                fencing_token: format!("{id}-1"),
                lease,
                idempotency_key: None,
                pins,
                started_by: None,
                trace: None,
            })
            .await
            .unwrap()
            .status
    }

    /// Whether `pid` runs (a zombie has ended).
    fn alive(pid: i32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| {
                s.rsplit_once(')')
                    .map(|(_, rest)| rest.trim_start().to_owned())
            })
            .is_some_and(|rest| !rest.starts_with('Z') && !rest.starts_with('X'))
    }

    /// The handler's and the grandchild's pids, once the handler wrote them.
    async fn pids(dir: &Path) -> (i32, i32) {
        let read = |name: &str| {
            std::fs::read_to_string(dir.join(name))
                .ok()
                .and_then(|t| t.trim().parse::<i32>().ok())
        };
        wait_for("the handler to write its pids", || {
            read("handler.pid").zip(read("grandchild.pid"))
        })
        .await
    }

    async fn wait_for<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
        let until = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(v) = f() {
                return v;
            }
            assert!(
                std::time::Instant::now() < until,
                "waited too long for {what}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Nothing is recorded for the step: no result, no failure, no began.
    async fn nothing_recorded(store: &Store, run: &RunId) {
        let journal = store.run_journal(run).await.unwrap();
        assert!(
            journal.iter().all(|e| e.step != "hold"),
            "nothing is journaled for the stopped attempt: {journal:?}"
        );
        let s = store.run_status(None, run).await.unwrap().unwrap();
        assert_eq!(s.state, RunState::Running, "the run stays open: {s:?}");
    }

    /// A successor takes the run over once its lease lapsed and completes it.
    async fn a_successor_completes(ts: &TestStore, ws: &Path, run: &RunId, lease: Duration) {
        let store = &ts.store;
        ts.advance(lease).await;
        let until = std::time::Instant::now() + Duration::from_secs(30);
        let taken = loop {
            let s = store.run_status(None, run).await.unwrap().unwrap();
            match store
                .take_run(Takeover {
                    run_id: run.clone(),
                    expected_epoch: s.epoch,
                    holder: "host-b/1".into(),
                    fencing_token: format!("{run}-2"),
                    lease: Duration::from_secs(30),
                    rule: TakeoverRule::LeaseExpired,
                })
                .await
            {
                Ok(t) => break t,
                Err(e) => {
                    assert!(std::time::Instant::now() < until, "no takeover: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        };
        assert_eq!(taken.epoch, 2);
        let d = driver(store, Arc::new(store.clone()), ws, Duration::from_secs(30));
        let end = d
            .drive(taken, Arc::new(Notify::new()), CancellationToken::new())
            .await
            .unwrap();
        assert_eq!(end, DriveEnd::Completed);
        let journal = store.run_journal(run).await.unwrap();
        let results: Vec<_> = journal
            .iter()
            .filter(|e| e.step == "hold" && e.kind == StepEntryKind::Result)
            .collect();
        assert_eq!(results.len(), 1, "{journal:?}");
        assert_eq!(results[0].epoch, 2);
        assert!(results[0].body.contains("later"), "{}", results[0].body);
    }

    pub async fn a_driver_that_cannot_confirm_its_lease_stops_its_handler_before_the_lease_lapses(
        ts: &TestStore,
    ) {
        let tmp = tempfile::tempdir().unwrap();
        let ws = workspace(tmp.path());
        let lease = Duration::from_secs(3);
        let store = &ts.store;
        let d = driver(store, Arc::new(HangingRenewals(store.clone())), &ws, lease);
        let granted = std::time::Instant::now();
        let s = start(store, &d, "run-unconfirmed", tmp.path(), lease).await;
        let run = s.run_id.clone();
        let expires_at = s.lease_expires_at_ms;
        let driving = tokio::spawn(async move {
            d.drive(s, Arc::new(Notify::new()), CancellationToken::new())
                .await
        });
        let (handler, grandchild) = pids(tmp.path()).await;
        assert!(alive(handler) && alive(grandchild));
        // The old driver went on renewing into the void, the handler running, for ever.
        let ended = tokio::time::timeout(lease * 3, driving)
            .await
            .expect("the driver stops on its own")
            .unwrap();
        let held_for = granted.elapsed();
        let now = store.now_ms().await.unwrap();
        assert!(
            matches!(ended, Err(DriveError::LeaseUnconfirmed { .. })),
            "{ended:?}"
        );
        assert!(
            held_for < lease,
            "the handler was stopped {held_for:?} after the lease was granted, not within {lease:?}"
        );
        assert!(!alive(handler), "the handler is gone");
        assert!(!alive(grandchild), "the grandchild is gone");
        assert!(
            now < expires_at,
            "both were gone {} ms before the lease could lapse",
            expires_at - now
        );
        nothing_recorded(store, &run).await;
        a_successor_completes(ts, &ws, &run, lease).await;
    }

    pub async fn a_halted_drive_stops_its_handler_mid_invoke_and_records_nothing(ts: &TestStore) {
        let tmp = tempfile::tempdir().unwrap();
        let ws = workspace(tmp.path());
        let lease = Duration::from_secs(2);
        let store = &ts.store;
        let d = driver(store, Arc::new(store.clone()), &ws, lease);
        let s = start(store, &d, "run-halted", tmp.path(), lease).await;
        let run = s.run_id.clone();
        let (stop, halt) = (CancellationToken::new(), CancellationToken::new());
        let driving = tokio::spawn({
            let (stop, halt) = (stop.clone(), halt.clone());
            async move { d.drive_until(s, Arc::new(Notify::new()), stop, halt).await }
        });
        let (handler, grandchild) = pids(tmp.path()).await;
        // A drain: first the stop (the step in flight may finish), then its deadline.
        stop.cancel();
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(alive(handler), "a stop alone lets the step in flight run");
        halt.cancel();
        let ended = tokio::time::timeout(Duration::from_secs(10), driving)
            .await
            .expect("a halted drive ends")
            .unwrap()
            .unwrap();
        assert_eq!(ended, DriveEnd::Stopped);
        assert!(!alive(handler), "the handler is gone");
        assert!(!alive(grandchild), "the grandchild is gone");
        nothing_recorded(store, &run).await;
        a_successor_completes(ts, &ws, &run, lease).await;
    }
}

sessionstore::both_backends!(cases =>
    a_driver_that_cannot_confirm_its_lease_stops_its_handler_before_the_lease_lapses,
    a_halted_drive_stops_its_handler_mid_invoke_and_records_nothing,
);
