//! `down` acting for an `up` that is gone: it stops exactly the recorded process groups it can
//! prove are the ones recorded, and refuses anything else.

mod common;

use std::os::unix::process::CommandExt;
use std::process::{Child, Command};

use common::{FIXTURE, TempWorkspace, assert_no_orphans};
use flow::procfs::{self, StartIdentity};
use flow::state::{self, FlowState, STATE_VERSION, ServiceRecord, StatePaths};
use flow::{DownAction, DownOptions, StopOutcome, down};

fn spawn_group(args: &[&str]) -> (Child, StartIdentity) {
    let child = Command::new(FIXTURE)
        .args(args)
        .process_group(0)
        .spawn()
        .expect("spawn");
    let identity = procfs::identity(child.id() as i32).expect("identity");
    (child, identity)
}

/// The identity of a process that has exited: a supervisor that crashed.
fn dead_supervisor() -> StartIdentity {
    let (mut child, identity) = spawn_group(&["sleep"]);
    child.kill().expect("kill");
    child.wait().expect("wait");
    identity
}

fn record(name: &str, identity: &StartIdentity) -> ServiceRecord {
    ServiceRecord {
        name: name.into(),
        state: "running".into(),
        process: Some(identity.clone()),
        endpoints: vec![],
        restarts: 0,
        detail: None,
        env: vec![],
    }
}

fn write_state(paths: &StatePaths, layers: Vec<Vec<String>>, services: Vec<ServiceRecord>) {
    state::write_state(
        paths,
        &FlowState {
            version: STATE_VERSION,
            flow: "crashed".into(),
            supervisor: dead_supervisor(),
            started_at: "earlier".into(),
            teardown_layers: layers,
            services,
            budget: None,
            up: true,
        },
    )
    .expect("write state");
}

fn options() -> DownOptions {
    DownOptions {
        teardown_layer_budget: Some(std::time::Duration::from_secs(3)),
        ..DownOptions::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn down_stops_every_group_a_crashed_up_recorded_in_reverse_layers() {
    let ws = TempWorkspace::new(&[]);
    let paths = StatePaths::for_workspace(ws.root());
    let (mut db, db_id) = spawn_group(&["sleep", "--child"]);
    let (mut api, api_id) = spawn_group(&["sleep"]);
    write_state(
        &paths,
        vec![vec!["api".into()], vec!["db".into()]],
        vec![record("db", &db_id), record("api", &api_id)],
    );
    let report = down(ws.root(), &options()).await.unwrap();
    assert_eq!(report.action, DownAction::StoppedDirectly);
    let order: Vec<(&str, usize, StopOutcome)> = report
        .teardown
        .receipts
        .iter()
        .map(|r| (r.service.as_str(), r.layer, r.outcome))
        .collect();
    assert_eq!(
        order,
        vec![
            ("api", 0, StopOutcome::Stopped),
            ("db", 1, StopOutcome::Stopped)
        ]
    );
    assert!(report.clean());
    assert!(!paths.state_file.exists());
    assert_eq!(
        state::read_receipts(&paths)
            .unwrap()
            .unwrap()
            .receipts
            .len(),
        2
    );
    db.wait().unwrap();
    api.wait().unwrap();
    assert_no_orphans(&[("db".into(), db_id.pgid), ("api".into(), api_id.pgid)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn down_refuses_to_signal_a_group_whose_recorded_identity_does_not_match() {
    let ws = TempWorkspace::new(&[]);
    let paths = StatePaths::for_workspace(ws.root());
    let (mut stranger, real) = spawn_group(&["sleep"]);
    // Same pid and group, another start time: the record is not this process's.
    let forged = StartIdentity {
        start_time: real.start_time + 1,
        ..real.clone()
    };
    write_state(
        &paths,
        vec![vec!["svc".into()]],
        vec![record("svc", &forged)],
    );
    let report = down(ws.root(), &options()).await.unwrap();
    let receipt = report.teardown.receipt("svc").unwrap();
    assert_eq!(receipt.outcome, StopOutcome::Failed, "{receipt:?}");
    assert!(receipt.detail.contains("refused"), "{receipt:?}");
    assert!(!report.clean());
    assert!(
        stranger.try_wait().unwrap().is_none(),
        "the unproven process must not have been signalled"
    );
    assert!(
        paths.state_file.exists(),
        "what could not be proven stays recorded"
    );
    stranger.kill().unwrap();
    stranger.wait().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn down_treats_a_recorded_group_that_no_longer_exists_as_stopped() {
    let ws = TempWorkspace::new(&[]);
    let paths = StatePaths::for_workspace(ws.root());
    let (mut gone, identity) = spawn_group(&["sleep"]);
    gone.kill().unwrap();
    gone.wait().unwrap();
    write_state(
        &paths,
        vec![vec!["old".into()]],
        vec![record("old", &identity)],
    );
    let report = down(ws.root(), &options()).await.unwrap();
    let receipt = report.teardown.receipt("old").unwrap();
    assert_eq!(
        (receipt.outcome, receipt.detail.as_str()),
        (StopOutcome::Stopped, "was already gone")
    );
    assert!(!paths.state_file.exists());
}

#[tokio::test]
async fn down_with_nothing_recorded_says_so() {
    let ws = TempWorkspace::new(&[]);
    let report = down(ws.root(), &DownOptions::default()).await.unwrap();
    assert_eq!(report.action, DownAction::NothingRecorded);
    assert!(report.teardown.receipts.is_empty());
}
