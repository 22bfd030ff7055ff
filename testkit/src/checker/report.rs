//! What a check found: the violations (each with its stable code, the session and command it
//! names and the evidence), a summary of the run (commands admitted, their outcomes, faults by
//! kind) and, for each offending session, its recorded timeline and its state in the store, so
//! the report alone is enough to understand a failure and to replay the run by its seed. Owns
//! the rendering; never reads a store and never judges anything.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use sessionstore::{CommandId, RecordKind, SessionId};
use wire_enum::wire_enum;

use crate::history::History;

use super::view::{SessionView, StoreView};

wire_enum! {
    /// What was wrong.
    #[derive(PartialOrd, Ord)]
    pub enum ViolationKind {
        /// The client's admission was acknowledged, and the store has no such command.
        Lost = "lost",
        /// The command had not ended when the check ran (after the fleet healed and settled).
        Wedged = "wedged",
        /// The journal holds more than one disposition for one command.
        DuplicateDisposition = "duplicate_disposition",
        /// The command's outcome is not the one its journal evidence proves (or it has an
        /// outcome with no evidence, or evidence with no attempt).
        EvidenceMismatch = "evidence_mismatch",
        /// The journal holds a disposition for a command the session does not have.
        OrphanEvidence = "orphan_evidence",
        /// A command that did not apply has an effect in the journal (an event it caused, or
        /// its marker).
        EffectNotApplied = "effect_not_applied",
        /// A marker's effect is in the journal more than once, or more than one command
        /// carrying it applied.
        MarkerAppliedTwice = "marker_applied_twice",
        /// An applied input's marker is not in the journal.
        MarkerMissing = "marker_missing",
        /// Commands applied out of acceptance order, or admitted out of the order their client
        /// made them in.
        OutOfOrder = "out_of_order",
        /// A client observed something the store contradicts (another outcome, another order).
        ObservationContradicted = "observation_contradicted",
        /// The history itself cannot be judged (a session not read, a marker inside another).
        BadHistory = "bad_history",
    }
    kind = "violation";
}

/// One thing found wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub kind: ViolationKind,
    pub session: SessionId,
    pub command: Option<CommandId>,
    /// What was seen, in words: records, frames, observations.
    pub evidence: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} [{}]", self.kind, self.session)?;
        if let Some(c) = &self.command {
            write!(f, " {c}")?;
        }
        write!(f, ": {}", self.evidence)
    }
}

/// The run in numbers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    pub sessions: usize,
    /// Admissions the clients saw acknowledged.
    pub admitted: usize,
    /// Admissions whose fate the clients did not learn.
    pub uncertain: usize,
    /// Admissions refused.
    pub refused: usize,
    /// Commands in the store, by outcome (`applied`, `no_op`, `refused`, `not_applied`,
    /// `rejected`) or by state when not ended.
    pub by_outcome: BTreeMap<String, usize>,
    /// Faults recorded, by kind.
    pub faults: BTreeMap<String, usize>,
}

impl Summary {
    /// Commands the store holds.
    pub fn commands(&self) -> usize {
        self.by_outcome.values().sum()
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} sessions; {} commands in the store (",
            self.sessions,
            self.commands()
        )?;
        let outcomes: Vec<String> = self
            .by_outcome
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        write!(f, "{})", outcomes.join(", "))?;
        write!(
            f,
            "; clients: {} admitted, {} uncertain, {} refused",
            self.admitted, self.uncertain, self.refused
        )?;
        let faults: usize = self.faults.values().sum();
        if faults > 0 {
            let kinds: Vec<String> = self
                .faults
                .iter()
                .map(|(k, n)| format!("{k} {n}"))
                .collect();
            write!(f, "; {faults} faults ({})", kinds.join(", "))?;
        }
        Ok(())
    }
}

/// At most this many timeline lines are printed per offending session (the latest ones).
const TIMELINE_LINES: usize = 400;

/// What a check found.
#[derive(Clone, Debug)]
pub struct Report {
    pub seed: Option<u64>,
    pub summary: Summary,
    pub violations: Vec<Violation>,
    /// The timeline and the store state of each offending session, rendered.
    pub offenders: String,
}

impl Report {
    /// True when nothing was found wrong.
    pub fn is_clean(&self) -> bool {
        self.violations.is_empty()
    }

    /// Violations by kind.
    pub fn counts(&self) -> BTreeMap<ViolationKind, usize> {
        let mut out = BTreeMap::new();
        for v in &self.violations {
            *out.entry(v.kind).or_default() += 1;
        }
        out
    }

    /// Panics with the whole report when anything was found wrong (for tests).
    #[track_caller]
    pub fn assert_clean(&self) {
        assert!(self.is_clean(), "{self}");
    }

    pub(super) fn new(
        history: &History,
        view: &StoreView,
        summary: Summary,
        violations: Vec<Violation>,
    ) -> Report {
        let offending: BTreeSet<&SessionId> = violations.iter().map(|v| &v.session).collect();
        let mut offenders = String::new();
        for s in offending {
            render_session(&mut offenders, history, view.session(s), s);
        }
        Report {
            seed: history.seed,
            summary,
            violations,
            offenders,
        }
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.seed {
            Some(seed) => writeln!(f, "exactly-once check, seed {seed}")?,
            None => writeln!(f, "exactly-once check")?,
        }
        writeln!(f, "{}", self.summary)?;
        if self.is_clean() {
            return writeln!(f, "no violations");
        }
        writeln!(f, "{} violations:", self.violations.len())?;
        for v in &self.violations {
            writeln!(f, "  {v}")?;
        }
        if let Some(seed) = self.seed {
            writeln!(f, "replay with --seed {seed}")?;
        }
        write!(f, "{}", self.offenders)
    }
}

fn render_session(out: &mut String, history: &History, view: Option<&SessionView>, s: &SessionId) {
    use std::fmt::Write;
    let _ = writeln!(out, "\n== session {s}");
    let timeline: Vec<_> = history.timeline(s).collect();
    if timeline.iter().any(|e| e.session.is_some()) {
        let skip = timeline.len().saturating_sub(TIMELINE_LINES);
        let _ = writeln!(out, "-- history ({} entries)", timeline.len());
        if skip > 0 {
            let _ = writeln!(out, "   ... {skip} earlier entries left out");
        }
        for e in &timeline[skip..] {
            let _ = writeln!(out, "   {e}");
        }
    }
    let Some(view) = view else {
        let _ = writeln!(out, "-- not read from the store");
        return;
    };
    let _ = writeln!(
        out,
        "-- store: runtime session {}, residency {:?}",
        view.record.binding.runtime_session_id,
        view.residency
            .as_ref()
            .map(|l| (l.epoch, l.host.as_ref().map(|h| h.to_string())))
    );
    let _ = writeln!(
        out,
        "   order  command                          kind           state      outcome      attempt (residency/journal epoch)  evidence  reason"
    );
    for c in &view.commands {
        let attempt = c
            .attempt
            .as_ref()
            .map(|a| format!("{}/{}", a.residency_epoch.0, a.journal_epoch.0))
            .unwrap_or_else(|| "-".into());
        let _ = writeln!(
            out,
            "   {:>5}  {:<32} {:<14} {:<10} {:<12} {:<34} {:<9} {}",
            c.accepted_order,
            c.command.as_str(),
            c.kind.as_str(),
            c.state.as_str(),
            c.outcome.map(|o| o.as_str()).unwrap_or("-"),
            attempt,
            c.evidence_seq
                .map(|s| s.to_string())
                .unwrap_or_else(|| "-".into()),
            c.reason.as_deref().unwrap_or("")
        );
    }
    let _ = writeln!(out, "-- journal ({} records)", view.journal.len());
    for r in &view.journal {
        let what = match &r.kind {
            RecordKind::Fence => "fence".to_owned(),
            RecordKind::Event {
                public_body, cause, ..
            } => format!(
                "event{} {}",
                cause.map(|c| format!(" (cause {c})")).unwrap_or_default(),
                String::from_utf8_lossy(public_body)
            ),
            RecordKind::Control { cause, .. } => format!(
                "control{}",
                cause.map(|c| format!(" (cause {c})")).unwrap_or_default()
            ),
            RecordKind::Application {
                identity,
                attempt,
                attempt_epoch,
                outcome,
                ..
            } => format!(
                "application {} {} attempt {} (journal epoch {})",
                identity.command, outcome, attempt, attempt_epoch.0
            ),
            RecordKind::Closure {
                identity,
                attempt,
                attempt_epoch,
            } => format!(
                "closure {} attempt {} (journal epoch {})",
                identity.command, attempt, attempt_epoch.0
            ),
        };
        let _ = writeln!(out, "   {:>5} e{:<3} {what}", r.seq, r.epoch.0);
    }
}
