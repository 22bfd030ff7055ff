//! What a flow tells its watcher while it works: lifecycle steps, readiness waits, service
//! output, exits, restarts and teardown receipts.
//!
//! This module owns the event vocabulary and the bounded sink that carries it. It must never
//! block the engine or a service's output on a slow watcher: a full sink drops the event
//! (the per-service log file keeps every output line regardless).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::mpsc;
use wire_enum::wire_enum;

use crate::predicate::ReadinessFailure;
use crate::teardown::Receipt;

wire_enum! {
    /// Which pipe a line of output came from.
    pub enum OutputStream {
        Stdout = "out",
        Stderr = "err",
    }
    kind = "output_stream";
}

wire_enum! {
    /// The action steps a service goes through on its way up.
    pub enum Step {
        /// Validated and given its ports.
        Load = "load",
        /// Its environment resolved (its producers' addresses and its own).
        Init = "init",
        /// Its process spawned in its own process group.
        Start = "start",
        /// Passed every readiness predicate.
        Running = "running",
        /// A one-shot job that exited with status 0.
        Completed = "completed",
    }
    kind = "step";
}

#[derive(Debug, Clone)]
pub enum FlowEvent {
    Step {
        service: String,
        step: Step,
        detail: String,
    },
    /// A process was spawned for the service as the leader of process group `pid`.
    Spawned {
        service: String,
        pid: i32,
    },
    /// A readiness round failed and the service is still inside its deadline.
    Waiting {
        service: String,
        failure: ReadinessFailure,
        elapsed: Duration,
        deadline: Duration,
    },
    Output {
        service: String,
        stream: OutputStream,
        line: String,
    },
    Exited {
        service: String,
        exit: String,
    },
    Restarting {
        service: String,
        attempt: u32,
        delay: Duration,
    },
    Failed {
        service: String,
        reason: String,
    },
    /// Every selected service is running (or completed).
    Up {
        services: usize,
        elapsed: Duration,
    },
    TeardownStarted {
        layers: usize,
    },
    Stopped(Receipt),
    /// Something the user should know about how the flow was put together (for instance an
    /// `external` declaration a reference superseded); the flow goes on.
    Notice {
        service: String,
        text: String,
    },
    /// Something that works but is probably wrong (for instance a service answering off
    /// loopback); the flow goes on.
    Warning {
        service: String,
        text: String,
    },
}

/// A cheap-to-clone, bounded, never-blocking sender of [`FlowEvent`]s.
#[derive(Debug, Clone, Default)]
pub struct EventSink {
    tx: Option<mpsc::Sender<FlowEvent>>,
    dropped: Arc<AtomicU64>,
}

impl EventSink {
    /// A sink and its receiver, holding at most `capacity` undelivered events.
    pub fn channel(capacity: usize) -> (EventSink, mpsc::Receiver<FlowEvent>) {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        (
            EventSink {
                tx: Some(tx),
                dropped: Arc::default(),
            },
            rx,
        )
    }

    /// A sink that discards everything.
    pub fn none() -> EventSink {
        EventSink::default()
    }

    pub fn emit(&self, event: FlowEvent) {
        if let Some(tx) = &self.tx
            && tx.try_send(event).is_err()
        {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Events dropped because the watcher fell behind (or went away).
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}
