//! The dispositions a session keeps in memory: those of the newest commands it folded, at most
//! [`RECENT_DISPOSITIONS`], oldest forgotten first. A duplicate delivery close behind its first
//! is answered from here; anything older is read from the journal, which indexes dispositions
//! by command (see `session`). So a session's memory does not grow with its history.

use std::collections::{HashMap, VecDeque};

use department::Recorded;
use sessionstore::RuntimeCommandId;

/// How many dispositions a session keeps in memory.
pub(crate) const RECENT_DISPOSITIONS: usize = 64;

/// A bounded map of runtime command → recorded disposition.
#[derive(Debug, Default)]
pub(crate) struct RecentDispositions {
    by_command: HashMap<RuntimeCommandId, Recorded>,
    order: VecDeque<RuntimeCommandId>,
}

impl RecentDispositions {
    /// Remembers a disposition, forgetting the oldest past the bound.
    pub fn insert(&mut self, rc: RuntimeCommandId, recorded: Recorded) {
        if self.by_command.insert(rc, recorded).is_none() {
            self.order.push_back(rc);
        }
        while self.order.len() > RECENT_DISPOSITIONS {
            if let Some(old) = self.order.pop_front() {
                self.by_command.remove(&old);
            }
        }
    }

    /// The remembered disposition of `rc`, if it is recent.
    pub fn get(&self, rc: &RuntimeCommandId) -> Option<Recorded> {
        self.by_command.get(rc).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_disposition_is_forgotten_past_the_bound() {
        let mut recent = RecentDispositions::default();
        let ids: Vec<RuntimeCommandId> = (0..=RECENT_DISPOSITIONS)
            .map(|_| RuntimeCommandId::mint())
            .collect();
        for (i, rc) in ids.iter().enumerate() {
            recent.insert(
                *rc,
                Recorded::applied(sessionstore::ApplicationOutcome::Applied, i as u64 + 1),
            );
        }
        assert_eq!(recent.get(&ids[0]), None);
        assert_eq!(
            recent.get(&ids[RECENT_DISPOSITIONS]).map(|r| r.seq),
            Some(RECENT_DISPOSITIONS as u64 + 1)
        );
        assert_eq!(recent.by_command.len(), RECENT_DISPOSITIONS);
    }
}
