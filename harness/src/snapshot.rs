//! A session's snapshot: its fold ([`SessionState`]) written to the store so a restore reads
//! it and folds only the journal records after it. Owns the encoding and its version.
//!
//! The body is JSON of the fold's bounded parts — started and compatibility, the conversation
//! window, open gates, pending inputs and the turn in flight — never the recent dispositions
//! (they are read from the journal on a miss) nor a gate's waiter (live only). [`FORMAT`]
//! names the encoding: a change to any type it serialises bumps it, and a snapshot of another
//! format is not read (the restore folds the whole journal instead). The store checks the
//! body's digest; whatever is unreadable here is a fallback too, never a guess.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::history::TurnTranscript;
use crate::state::{OpenGate, OpenTurn, PendingInput, SessionState, Window, turn_bytes};

/// The encoding of a snapshot body this build writes and reads.
pub(crate) const FORMAT: u32 = 1;

#[derive(Serialize)]
struct FoldRef<'a> {
    started: bool,
    compatibility: &'a Option<String>,
    turns: &'a VecDeque<TurnTranscript>,
    open_gates: &'a BTreeMap<Uuid, OpenGate>,
    inputs: &'a VecDeque<PendingInput>,
    open_turn: &'a Option<OpenTurn>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Fold {
    started: bool,
    compatibility: Option<String>,
    turns: VecDeque<TurnTranscript>,
    open_gates: BTreeMap<Uuid, OpenGate>,
    inputs: VecDeque<PendingInput>,
    open_turn: Option<OpenTurn>,
}

/// The body of a snapshot of `state`.
pub(crate) fn encode(state: &SessionState) -> Result<Vec<u8>, String> {
    serde_json::to_vec(&FoldRef {
        started: state.started,
        compatibility: &state.compatibility,
        turns: &state.turns,
        open_gates: &state.open_gates,
        inputs: &state.inputs,
        open_turn: &state.open_turn,
    })
    .map_err(|e| format!("the fold does not encode: {e}"))
}

/// The state a snapshot body of `format` holds, its conversation fitted to `window`.
pub(crate) fn decode(format: u32, body: &[u8], window: Window) -> Result<SessionState, String> {
    if format != FORMAT {
        return Err(format!(
            "the snapshot is in format {format}; this build reads {FORMAT}"
        ));
    }
    let fold: Fold =
        serde_json::from_slice(body).map_err(|e| format!("the snapshot does not decode: {e}"))?;
    if !fold.started && (!fold.turns.is_empty() || fold.open_turn.is_some()) {
        return Err("the snapshot holds turns of a conversation never started".into());
    }
    let mut state = SessionState::new(window);
    state.started = fold.started;
    state.compatibility = fold.compatibility;
    state.turn_bytes = fold.turns.iter().map(turn_bytes).sum();
    state.turns = fold.turns;
    state.open_gates = fold.open_gates;
    state.inputs = fold.inputs;
    state.open_turn = fold.open_turn;
    state.trim();
    Ok(state)
}

/// What a target's sessions did with snapshots, for operators (counts since the start).
#[derive(Debug, Default)]
pub struct SnapshotStats {
    written: AtomicU64,
    failed: AtomicU64,
    restored_from: AtomicU64,
    fell_back: AtomicU64,
}

/// A reading of [`SnapshotStats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SnapshotCounts {
    /// Snapshots stored.
    pub written: u64,
    /// Snapshot writes that failed (logged; the session went on without).
    pub failed: u64,
    /// Restores that started from a snapshot.
    pub restored_from: u64,
    /// Restores that found a snapshot they could not use and folded the whole journal.
    pub fell_back: u64,
}

impl SnapshotStats {
    pub fn counts(&self) -> SnapshotCounts {
        SnapshotCounts {
            written: self.written.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            restored_from: self.restored_from.load(Ordering::Relaxed),
            fell_back: self.fell_back.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn wrote(&self) {
        self.written.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn failed(&self) {
        self.failed.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn restored(&self) {
        self.restored_from.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn fell_back(&self) {
        self.fell_back.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOW: Window = Window {
        turns: 2,
        bytes: 1024,
    };

    #[test]
    fn another_format_or_a_damaged_body_is_not_read() {
        let mut state = SessionState::new(WINDOW);
        state.started = true;
        let body = encode(&state).unwrap();
        assert!(decode(FORMAT, &body, WINDOW).unwrap().started);
        assert!(decode(FORMAT + 1, &body, WINDOW).is_err());
        assert!(decode(FORMAT, &body[..body.len() - 1], WINDOW).is_err());
        assert!(decode(FORMAT, b"{\"started\":true}", WINDOW).is_err());
    }

    #[test]
    fn a_restored_conversation_is_fitted_to_the_window() {
        let mut state = SessionState::new(Window {
            turns: 10,
            bytes: 1024,
        });
        state.started = true;
        for i in 0..5 {
            state.turns.push_back(TurnTranscript {
                turn_id: format!("t{i}"),
                user: format!("u{i}"),
                messages: Vec::new(),
                end: None,
            });
        }
        let body = encode(&state).unwrap();
        let back = decode(FORMAT, &body, WINDOW).unwrap();
        let ids: Vec<&str> = back.turns.iter().map(|t| t.turn_id.as_str()).collect();
        assert_eq!(ids, ["t3", "t4"]);
        assert_eq!(back.turn_bytes, 4);
    }
}
