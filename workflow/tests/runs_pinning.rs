//! Runs pinned to the releases they started with, over real stores (SQLite and PostgreSQL) and
//! a real workspace whose runnables were never built: pinned at start (built, published),
//! replayed on another "Host" (another driver with its own cache folder and no workspace) from
//! the store with the same ids, whatever the workspace holds by then; a pinned release that is
//! gone or changed fails its step with a stable code; a run recorded before pinning is pinned
//! once at its first drive.

mod cases {
    use std::collections::BTreeSet;
    use std::path::{Path, PathBuf};
    use std::sync::Arc;
    use std::time::Duration;

    use runnable::Runner;
    use serde_json::{Value, json};
    use sessionstore::testing::TestStore;
    use sessionstore::*;
    use tokio::sync::Notify;
    use tokio_util::sync::CancellationToken;
    use workflow::driver::failure_codes;
    use workflow::{
        DriveEnd, Driver, DriverOptions, NoEvents, StartRefusal, StoreReleases, WorkspaceRunnables,
        pin_new_run,
    };

    /// An idempotent handler that appends the ids it was handed (and its own version) to the
    /// file its input names, then waits for the `go` file when its input names one.
    const STAMP: &str = r#"
import json, os, sys, time
req = json.load(sys.stdin)
inp = req["input"]
with open(inp["log"], "a") as f:
    f.write(json.dumps({"version": VERSION, "intent_id": req["intent_id"], "effect_id": req["effect_id"], "digest": req["digest"]}) + "\n")
go = inp.get("go")
if go:
    until = time.time() + 60
    while not os.path.exists(go) and time.time() < until:
        time.sleep(0.02)
print(json.dumps({"ok": True, "output": {"version": VERSION}}))
"#;

    const DECLARATION: &str = "\
name: stamp
version: 1.0.0
input:
  type: object
  properties:
    log: {type: string}
    go: {type: string}
  required: [log]
output:
  type: object
  properties: {version: {type: string}}
  required: [version]
command: python3
args: [stamp.py]
timeout: 30s
effect: idempotent
";

    const PROGRAM: &str = "\
steps:
  - name: stamp
    invoke: stamp@1.0.0
    input: {log: \"${input.log}\", go: \"${input.go}\"}
";

    /// A workspace `shop` holding `stamp@1.0.0` at `version`, never built.
    fn workspace(root: &Path, version: &str) -> PathBuf {
        let ws = root.join("shop");
        let dir = ws.join("runnables/stamp");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("runnable.yaml"), DECLARATION).unwrap();
        std::fs::write(
            dir.join("stamp.py"),
            format!("VERSION = {version:?}\n{STAMP}"),
        )
        .unwrap();
        ws
    }

    /// Breaks the workspace in two ways: the pinned runnable's handler now says `v2`, and an
    /// unrelated declaration no longer loads.
    fn break_workspace(ws: &Path) {
        std::fs::write(
            ws.join("runnables/stamp/stamp.py"),
            format!("VERSION = \"v2\"\n{STAMP}"),
        )
        .unwrap();
        let other = ws.join("runnables/zz-unrelated");
        std::fs::create_dir_all(&other).unwrap();
        std::fs::write(other.join("runnable.yaml"), "name: [not, a, name]\n").unwrap();
    }

    fn env(ws: Option<&Path>) -> Arc<WorkspaceRunnables> {
        Arc::new(WorkspaceRunnables {
            runner: ws.map(|w| Runner::open(w).unwrap()),
            agents: BTreeSet::new(),
        })
    }

    /// A driver as one Host has it: its own cache folder, its workspace if any.
    fn host(store: &Store, ws: Option<&Path>, state: &Path, lease: Duration) -> Driver {
        let releases = Arc::new(StoreReleases::new(
            store.clone(),
            ws.map(|w| Runner::open(w).unwrap()),
            state,
        ));
        Driver {
            journal: Arc::new(store.clone()),
            env: env(ws),
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

    async fn record(store: &Store, id: &str, input: Value, pins: Vec<RunPin>) -> RunStatus {
        store
            .create_run(NewRun {
                run_id: RunId::new(id).unwrap(),
                tenant: TenantId::new("acme").unwrap(),
                source: PROGRAM.into(),
                input: input.to_string(),
                holder: "host-a/1".into(),
                fencing_token: format!("{id}-1"),
                lease: Duration::from_secs(60),
                idempotency_key: None,
                pins,
                started_by: None,
                trace: None,
            })
            .await
            .unwrap()
            .status
    }

    /// Starts a run the way a Host with workspace `ws` does: validated, pinned, recorded.
    async fn start(store: &Store, ws: &Path, state: &Path, id: &str, input: Value) -> RunStatus {
        let d = host(store, Some(ws), state, Duration::from_secs(60));
        let pins = match pin_new_run(PROGRAM, d.env.as_ref(), d.releases.as_ref()).await {
            Ok(p) => p,
            Err(StartRefusal::Problems(p)) => panic!("{p:?}"),
            Err(StartRefusal::Release(e)) => panic!("{e}"),
        };
        record(store, id, input, pins).await
    }

    async fn take(store: &Store, run: &RunId, holder: &str, token: &str) -> RunStatus {
        let s = store.run_status(None, run).await.unwrap().unwrap();
        store
            .take_run(Takeover {
                run_id: run.clone(),
                expected_epoch: s.epoch,
                holder: holder.into(),
                fencing_token: token.into(),
                lease: Duration::from_secs(60),
                rule: TakeoverRule::HeldByOrExpired("host-a/".into()),
            })
            .await
            .unwrap()
    }

    fn lines(log: &Path) -> Vec<Value> {
        std::fs::read_to_string(log)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    async fn drive(d: &Driver, s: RunStatus) -> DriveEnd {
        d.drive(s, Arc::new(Notify::new()), CancellationToken::new())
            .await
            .unwrap()
    }

    pub async fn a_takeover_runs_the_pinned_release_from_the_store_with_the_same_ids(
        ts: &TestStore,
    ) {
        let tmp = tempfile::tempdir().unwrap();
        let ws = workspace(tmp.path(), "v1");
        let (log, go) = (tmp.path().join("stamps"), tmp.path().join("go"));
        let input = json!({"log": log, "go": go});
        let s = start(&ts.store, &ws, &tmp.path().join("state-a"), "run-1", input).await;
        let pins = ts.store.run_pins(&s.run_id).await.unwrap();
        assert_eq!(pins.len(), 1);
        assert_eq!(pins[0].identity, "shop/stamp@1.0.0");
        assert!(
            ts.store
                .package_summary("shop", "stamp", "1.0.0")
                .await
                .unwrap()
                .is_some_and(|p| p.digest == pins[0].digest),
            "the pinned release was published to the store"
        );

        // The first attempt starts its handler, which records its ids and waits.
        let a = host(
            &ts.store,
            Some(&ws),
            &tmp.path().join("state-a"),
            Duration::from_millis(300),
        );
        let first = tokio::spawn({
            let s = s.clone();
            async move { drive(&a, s).await }
        });
        testkit_wait(|| lines(&log).len() == 1).await;
        // Another Host takes the run over; the first attempt is fenced out.
        let taken = take(&ts.store, &s.run_id, "host-b/1", "run-1-2").await;
        assert_eq!(first.await.unwrap(), DriveEnd::Fenced);

        // Meanwhile the workspace changed: the handler is v2 and an unrelated file is broken.
        break_workspace(&ws);
        std::fs::write(&go, "").unwrap();
        // The new Host has no workspace at all and its own empty cache.
        let b = host(
            &ts.store,
            None,
            &tmp.path().join("state-b"),
            Duration::from_secs(60),
        );
        assert_eq!(drive(&b, taken).await, DriveEnd::Completed);
        let stamps = lines(&log);
        assert_eq!(stamps.len(), 2, "{stamps:?}");
        for stamp in &stamps {
            assert_eq!(stamp["version"], "v1", "the pinned handler ran: {stamps:?}");
            assert_eq!(stamp["digest"], pins[0].digest.as_str());
        }
        assert_eq!(stamps[0]["intent_id"], stamps[1]["intent_id"]);
        assert_eq!(
            stamps[0]["effect_id"], stamps[1]["effect_id"],
            "one step, one effect id, on every attempt and every Host"
        );
        let journal = ts.store.run_journal(&s.run_id).await.unwrap();
        let result = journal.iter().find(|e| e.step == "stamp").unwrap();
        let body: Value = serde_json::from_str(&result.body).unwrap();
        assert_eq!(body["output"]["version"], "v1");
    }

    pub async fn a_start_is_refused_under_the_workspaces_strict_loading_naming_the_broken_file(
        ts: &TestStore,
    ) {
        let tmp = tempfile::tempdir().unwrap();
        let ws = workspace(tmp.path(), "v1");
        break_workspace(&ws);
        let d = host(
            &ts.store,
            Some(&ws),
            &tmp.path().join("state"),
            Duration::from_secs(60),
        );
        let refused = pin_new_run(PROGRAM, d.env.as_ref(), d.releases.as_ref()).await;
        let Err(StartRefusal::Problems(problems)) = refused else {
            panic!("refused with problems, not {refused:?}");
        };
        assert!(
            problems
                .iter()
                .any(|p| p.message.contains("zz-unrelated/runnable.yaml")),
            "{problems:?}"
        );
        assert!(ts.store.packages().await.unwrap().is_empty());
    }

    /// Records a pinned run, then lets `tamper` change the store's packages under it.
    async fn replay_after(ts: &TestStore, tamper: &str) -> (RunStatus, DriveEnd) {
        let tmp = tempfile::tempdir().unwrap();
        let ws = workspace(tmp.path(), "v1");
        let log = tmp.path().join("stamps");
        let s = start(
            &ts.store,
            &ws,
            &tmp.path().join("state-a"),
            "run-1",
            json!({"log": log, "go": ""}),
        )
        .await;
        ts.exec_raw(tamper).await;
        let b = host(
            &ts.store,
            Some(&ws),
            &tmp.path().join("state-b"),
            Duration::from_secs(60),
        );
        let taken = take(&ts.store, &s.run_id, "host-b/1", "run-1-2").await;
        let end = drive(&b, taken).await;
        assert!(lines(&log).is_empty(), "no other code ran");
        let after = ts.store.run_status(None, &s.run_id).await.unwrap().unwrap();
        (after, end)
    }

    pub async fn a_pinned_release_gone_from_the_store_fails_its_step_with_a_stable_code(
        ts: &TestStore,
    ) {
        let (s, end) = replay_after(ts, "DELETE FROM runnable_packages").await;
        assert_eq!(
            end,
            DriveEnd::Failed {
                code: failure_codes::RELEASE_MISSING.into(),
                step: "stamp".into()
            }
        );
        let f = s.failure.unwrap();
        assert_eq!(
            (f.code.as_str(), f.step.as_str()),
            ("release_missing", "stamp")
        );
    }

    pub async fn a_pinned_release_whose_stored_bytes_changed_fails_its_step_with_a_stable_code(
        ts: &TestStore,
    ) {
        let (s, end) = replay_after(
            ts,
            &format!("UPDATE runnable_packages SET sha256 = '{}'", "0".repeat(64)),
        )
        .await;
        assert_eq!(
            end,
            DriveEnd::Failed {
                code: failure_codes::RELEASE_CHANGED.into(),
                step: "stamp".into()
            }
        );
        assert_eq!(s.failure.unwrap().code, "release_changed");
    }

    pub async fn a_run_recorded_before_pinning_is_pinned_once_at_its_first_drive(ts: &TestStore) {
        let tmp = tempfile::tempdir().unwrap();
        let ws = workspace(tmp.path(), "v1");
        let log = tmp.path().join("stamps");
        let s = record(
            &ts.store,
            "run-old",
            json!({"log": log, "go": ""}),
            Vec::new(),
        )
        .await;
        let d = host(
            &ts.store,
            Some(&ws),
            &tmp.path().join("state"),
            Duration::from_secs(60),
        );
        let taken = take(&ts.store, &s.run_id, "host-a/2", "run-old-2").await;
        assert_eq!(drive(&d, taken.clone()).await, DriveEnd::Completed);
        let pins = ts.store.run_pins(&s.run_id).await.unwrap();
        assert_eq!(pins.len(), 1, "pinned at its first drive");
        let stamps = lines(&log);
        assert_eq!(stamps.len(), 1);
        assert_eq!(stamps[0]["digest"], pins[0].digest.as_str());
    }

    /// Waits (up to 30 s) until `done` holds.
    async fn testkit_wait(done: impl Fn() -> bool) {
        for _ in 0..3000 {
            if done() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("never happened");
    }
}

sessionstore::both_backends!(cases =>
    a_takeover_runs_the_pinned_release_from_the_store_with_the_same_ids,
    a_start_is_refused_under_the_workspaces_strict_loading_naming_the_broken_file,
    a_pinned_release_gone_from_the_store_fails_its_step_with_a_stable_code,
    a_pinned_release_whose_stored_bytes_changed_fails_its_step_with_a_stable_code,
    a_run_recorded_before_pinning_is_pinned_once_at_its_first_drive,
);
