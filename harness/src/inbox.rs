//! What a session actor is sent, and the channels it shares with its turns and its handle.
//! The actor (`session`) is the one receiver and handles every message; a turn or a handle
//! only sends. Plain message and channel types: nothing here acts on them.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use department::{
    CommittedEvent, PersistenceFault, Preview, Recorded, RuntimeCommand, RuntimeError,
};
use sessionstore::{AttemptId, CommandIdentity, JournalEpoch, RuntimeCommandId};
use tokio::sync::{broadcast, oneshot, watch};
use uuid::Uuid;

use crate::events::{Cause, HarnessEvent};
use crate::model::ChatMessage;
use crate::state::Resolution;

/// Why a turn was stopped from outside.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum StopReason {
    /// An interrupt command: the turn ends `turn_interrupted`, caused by it.
    Interrupt(Cause, RuntimeCommandId),
    /// Abandonment or a fault: the turn writes nothing more.
    Silent,
}

/// What a turn asks the actor for.
pub(crate) enum TurnMsg {
    /// Append events (each with its causing runtime command, if any).
    Append {
        turn_id: String,
        events: Vec<(HarnessEvent, Option<RuntimeCommandId>)>,
        reply: oneshot::Sender<Result<(), ()>>,
    },
    /// Append a `gate_opened` and register the turn as its waiter.
    OpenGate {
        turn_id: String,
        event: HarnessEvent,
        reply: oneshot::Sender<Result<oneshot::Receiver<Resolution>, ()>>,
    },
    /// Become the waiter of a gate restored open.
    AwaitGate {
        gate: Uuid,
        reply: oneshot::Sender<Option<oneshot::Receiver<Resolution>>>,
    },
    /// A gate's timeout elapsed: resolve it `timeout` if it is still open.
    GateTimeout { gate: Uuid },
    /// The conversation so far, for the next model step (with the turn's own input when its
    /// `turn_started` is not journaled yet).
    Conversation {
        pending_input: Option<String>,
        reply: oneshot::Sender<Vec<ChatMessage>>,
    },
    /// The turn task ended (after writing its terminal event, or silently).
    Finished { turn_id: String },
}

/// A message to the actor. The inbox carries them boxed, so its buffer (allocated a block of
/// slots at a time) costs a pointer per slot rather than the largest message.
pub(crate) enum Msg {
    Apply(
        RuntimeCommand,
        oneshot::Sender<Result<Recorded, RuntimeError>>,
    ),
    Close {
        identity: CommandIdentity,
        attempt: AttemptId,
        attempt_epoch: JournalEpoch,
        reply: oneshot::Sender<Result<Recorded, RuntimeError>>,
    },
    Release(oneshot::Sender<Result<(), RuntimeError>>),
    Abandon(oneshot::Sender<Result<(), RuntimeError>>),
    Turn(TurnMsg),
}

impl Msg {
    /// A turn's message, boxed for the inbox.
    pub(crate) fn turn(t: TurnMsg) -> Box<Msg> {
        Box::new(Msg::Turn(t))
    }
}

/// How many committed events and previews a slow subscriber may fall behind.
pub(crate) const EVENT_BUFFER: usize = 64;

/// A broadcast whose buffer exists only while someone subscribes: made by the first
/// subscriber, dropped by the first send that finds nobody listening. An idle session nobody
/// watches holds none (each buffer is [`EVENT_BUFFER`] slots, several KiB).
pub(crate) struct LazyFanout<T> {
    tx: std::sync::Mutex<Option<broadcast::Sender<T>>>,
}

impl<T: Clone> LazyFanout<T> {
    pub fn new() -> LazyFanout<T> {
        LazyFanout {
            tx: std::sync::Mutex::new(None),
        }
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<broadcast::Sender<T>>> {
        match self.tx.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    pub fn subscribe(&self) -> broadcast::Receiver<T> {
        self.slot()
            .get_or_insert_with(|| broadcast::channel(EVENT_BUFFER).0)
            .subscribe()
    }

    /// Sends to whoever listens; with nobody left, the buffer is dropped.
    pub fn send(&self, item: T) {
        let mut slot = self.slot();
        if let Some(tx) = slot.as_ref()
            && (tx.receiver_count() == 0 || tx.send(item).is_err())
        {
            *slot = None;
        }
    }

    /// Whether a buffer is held now.
    #[cfg(test)]
    pub fn allocated(&self) -> bool {
        self.slot().is_some()
    }
}

/// Channels shared by the actor, its turns and the handle.
pub(crate) struct Shared {
    pub committed: broadcast::Sender<Arc<CommittedEvent>>,
    pub previews: LazyFanout<Preview>,
    pub idle: watch::Sender<bool>,
    pub faults: watch::Sender<Option<PersistenceFault>>,
    pub alive: watch::Sender<bool>,
    pub epoch: AtomicU64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fanout_holds_a_buffer_only_while_someone_listens() {
        let f: LazyFanout<u32> = LazyFanout::new();
        f.send(1);
        assert!(!f.allocated(), "nobody listened: no buffer");
        let mut rx = f.subscribe();
        assert!(f.allocated());
        f.send(2);
        assert_eq!(rx.try_recv().ok(), Some(2));
        drop(rx);
        f.send(3);
        assert!(
            !f.allocated(),
            "the last listener left: the buffer is dropped"
        );
        let mut again = f.subscribe();
        f.send(4);
        assert_eq!(again.try_recv().ok(), Some(4));
    }
}
