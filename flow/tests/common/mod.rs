//! Helpers shared by the flow integration tests: temporary workspaces, an event recorder,
//! and the orphan check every test that starts processes ends with.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flow::procfs;
use flow::{EventSink, FlowEvent, FlowOptions};
use tokio::sync::{Notify, mpsc};

/// The test service program built by cargo for this package.
pub const FIXTURE: &str = env!("CARGO_BIN_EXE_flow-fixture");

/// A workspace in a temporary folder, removed when dropped.
pub struct TempWorkspace {
    pub dir: tempfile::TempDir,
}

impl TempWorkspace {
    /// Writes `files` (relative path, contents); `{fixture}` in contents is replaced by the
    /// fixture's path and `{dir}` by the workspace folder.
    pub fn new(files: &[(&str, &str)]) -> TempWorkspace {
        let dir = tempfile::tempdir().expect("temp dir");
        for (path, contents) in files {
            let full = dir.path().join(path);
            std::fs::create_dir_all(full.parent().expect("parent")).expect("mkdir");
            let text = contents
                .replace("{fixture}", FIXTURE)
                .replace("{dir}", &dir.path().display().to_string());
            std::fs::write(full, text).expect("write");
        }
        TempWorkspace { dir }
    }

    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    pub fn read(&self, rel: &str) -> String {
        std::fs::read_to_string(self.path(rel)).unwrap_or_default()
    }
}

/// Options for fast tests: short backoff and budgets; everything else default.
pub fn fast_options() -> FlowOptions {
    FlowOptions {
        readiness_timeout: Duration::from_secs(20),
        readiness_backoff_initial: Duration::from_millis(20),
        readiness_backoff_max: Duration::from_millis(200),
        teardown_layer_budget: Duration::from_secs(5),
        kill_grace: Duration::from_secs(2),
        ..FlowOptions::default()
    }
}

/// Records every event of a flow and lets a test wait for one.
#[derive(Clone)]
pub struct Recorder {
    pub events: Arc<Mutex<Vec<FlowEvent>>>,
    notify: Arc<Notify>,
}

impl Recorder {
    pub fn start() -> (Recorder, EventSink) {
        let (sink, mut rx): (EventSink, mpsc::Receiver<FlowEvent>) = EventSink::channel(65536);
        let recorder = Recorder {
            events: Arc::default(),
            notify: Arc::default(),
        };
        let r = recorder.clone();
        tokio::spawn(async move {
            while let Some(e) = rx.recv().await {
                r.events.lock().expect("events").push(e);
                r.notify.notify_waiters();
            }
        });
        (recorder, sink)
    }

    pub fn snapshot(&self) -> Vec<FlowEvent> {
        self.events.lock().expect("events").clone()
    }

    /// Waits (up to 30 s) for an event matching `pred`.
    pub async fn wait_for(&self, what: &str, pred: impl Fn(&FlowEvent) -> bool) -> FlowEvent {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let notified = self.notify.notified();
            if let Some(e) = self.snapshot().into_iter().find(|e| pred(e)) {
                return e;
            }
            if tokio::time::Instant::now() >= deadline {
                panic!("no event {what} within 30 s; saw {:#?}", self.snapshot());
            }
            let _ = tokio::time::timeout(Duration::from_millis(100), notified).await;
        }
    }

    /// Every process group the flow spawned.
    pub fn spawned(&self) -> Vec<(String, i32)> {
        self.snapshot()
            .into_iter()
            .filter_map(|e| match e {
                FlowEvent::Spawned { service, pid } => Some((service, pid)),
                _ => None,
            })
            .collect()
    }

    /// The position of the first event matching `pred`.
    pub fn position(&self, pred: impl Fn(&FlowEvent) -> bool) -> Option<usize> {
        self.snapshot().iter().position(pred)
    }
}

/// Fails if any process of the given process groups still runs.
pub fn assert_no_orphans(groups: &[(String, i32)]) {
    assert!(!groups.is_empty(), "the test spawned nothing to check");
    for (service, pgid) in groups {
        let live = procfs::live_members(*pgid).expect("read /proc");
        assert!(
            live.is_empty(),
            "orphans of {service} (process group {pgid}) survive: {live:?}"
        );
    }
}

pub fn is_step(e: &FlowEvent, service: &str, step: flow::events::Step) -> bool {
    matches!(e, FlowEvent::Step { service: s, step: st, .. } if s == service && *st == step)
}
