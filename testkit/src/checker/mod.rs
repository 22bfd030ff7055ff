//! The exactly-once checker: judges a recorded [`History`] (what clients admitted and saw)
//! against the store's final state ([`StoreView`]) and reports every violation, each naming
//! its session, its command and the evidence, with the seed and the offending sessions'
//! timelines so the run can be replayed ([`Report`]). What it holds a run to:
//!
//! - **every admitted command ended exactly once**: an acknowledged admission is in the store
//!   (`lost`), every command has ended (`wedged`), the journal holds at most one disposition
//!   per command (`duplicate_disposition`) and none for a command the session lacks
//!   (`orphan_evidence`);
//! - **applied ⇔ the journal shows it**: a command with an attempt ended with exactly the
//!   outcome of its one disposition frame (same attempt, the frame its evidence sequence
//!   names); a command without one was rejected and has no frame (`evidence_mismatch`);
//! - **not applied ⇒ no effect**: a command whose outcome is not `applied` caused no journal
//!   record, and its marker is nowhere in the journal (`effect_not_applied`);
//! - **no marker applied twice**: a marker's user message (and tool result) is in the journal
//!   once per applied command carrying it, and at most one command carrying it applied
//!   (`marker_applied_twice`, `marker_missing`);
//! - **per-session order kept**: dispositions follow acceptance order, and a command admitted
//!   after its client saw another acknowledged is accepted after it (`out_of_order`);
//! - **what clients saw is true**: an observed outcome or acknowledged order is the store's
//!   (`observation_contradicted`).
//!
//! With [`History::empty`] only the store-side rules run. The caller decides when to check:
//! after the faults are healed and the fleet has had time to settle (a command still pending
//! then is reported `wedged`, with its deadline). Owns the rules; never writes the store.
//!
//! ```no_run
//! # async fn demo(store: sessionstore::Store, sessions: Vec<sessionstore::SessionRecord>,
//! #               recorder: testkit::history::Recorder) {
//! use testkit::checker::{StoreView, check};
//! let view = StoreView::read(&store, &sessions).await.expect("the store reads");
//! let report = check(&recorder.history(), &view);
//! println!("{report}"); // seed, summary, violations, offending timelines
//! report.assert_clean();
//! # }
//! ```

mod report;
mod view;

use std::collections::{BTreeMap, HashMap};

use sessionstore::{CommandId, CommandKind, CommandRecord, Outcome, SessionId};

use crate::history::{Event, History};

pub use report::{Report, Summary, Violation, ViolationKind};
pub use view::{PublicEventView, SessionView, StoreView};

/// Judges `history` against `view`. Every session named in the history must be in the view;
/// sessions in the view that the history never names are judged on the store's rules alone.
pub fn check(history: &History, view: &StoreView) -> Report {
    let mut found = Vec::new();
    let clients = ClientView::of(history);
    for session in clients.sessions.keys() {
        if view.session(session).is_none() {
            found.push(Violation {
                kind: ViolationKind::BadHistory,
                session: session.clone(),
                command: None,
                evidence: "the history names this session; the store view does not hold it".into(),
            });
        }
    }
    for s in &view.sessions {
        let client = clients.sessions.get(s.id());
        store_rules(s, view.read_at_ms, &mut found);
        if let Some(client) = client {
            client_rules(s, client, &mut found);
            marker_rules(s, client, &mut found);
        }
    }
    let summary = summarize(history, view, &clients);
    Report::new(history, view, summary, found)
}

/// What the history says about each command of one session.
#[derive(Default)]
struct ClientSession {
    /// Commands in the order they were first invoked.
    order: Vec<CommandId>,
    commands: HashMap<CommandId, ClientCommand>,
}

#[derive(Default)]
struct ClientCommand {
    kind: Option<CommandKind>,
    marker: Option<String>,
    /// Acknowledgements, with the accepted order when the client was told it (one per
    /// acknowledgement; resends repeat it).
    acked: Vec<Option<u64>>,
    uncertain: bool,
    refused: bool,
    observed: Vec<Outcome>,
    /// The highest accepted order the same session's client had seen acknowledged before
    /// this command was first invoked.
    after_acked: Option<(CommandId, u64)>,
}

#[derive(Default)]
struct ClientView {
    sessions: BTreeMap<SessionId, ClientSession>,
}

impl ClientView {
    fn of(history: &History) -> ClientView {
        let mut out = ClientView::default();
        // The latest acknowledgement each session's clients had seen, as the log goes.
        let mut latest: HashMap<SessionId, (CommandId, u64)> = HashMap::new();
        for e in &history.entries {
            let Some(session) = &e.session else { continue };
            let Some(command) = e.event.command() else {
                continue;
            };
            let s = out.sessions.entry(session.clone()).or_default();
            if !s.commands.contains_key(command) {
                s.order.push(command.clone());
            }
            let c = s.commands.entry(command.clone()).or_default();
            match &e.event {
                Event::Invoke { kind, marker, .. } => {
                    if c.kind.is_none() {
                        c.after_acked = latest.get(session).cloned();
                    }
                    c.kind = Some(*kind);
                    if marker.is_some() {
                        c.marker.clone_from(marker);
                    }
                }
                Event::Admitted { accepted_order, .. } => {
                    c.acked.push(*accepted_order);
                    if let Some(accepted) = accepted_order {
                        let newer = latest
                            .get(session)
                            .is_none_or(|(_, order)| order < accepted);
                        if newer {
                            latest.insert(session.clone(), (command.clone(), *accepted));
                        }
                    }
                }
                Event::Refused { .. } => c.refused = true,
                Event::Uncertain { .. } => c.uncertain = true,
                Event::Observed { outcome, .. } => c.observed.push(*outcome),
                Event::GaveUp { .. } | Event::Fault { .. } | Event::Note { .. } => {}
            }
        }
        out
    }
}

fn violation(
    kind: ViolationKind,
    s: &SessionView,
    command: Option<&CommandId>,
    evidence: String,
) -> Violation {
    Violation {
        kind,
        session: s.id().clone(),
        command: command.cloned(),
        evidence,
    }
}

fn brief(c: &CommandRecord) -> String {
    format!(
        "{} #{} state {} outcome {} attempt {} evidence_seq {} epoch_mark {}",
        c.kind,
        c.accepted_order,
        c.state,
        c.outcome.map(|o| o.as_str()).unwrap_or("-"),
        c.attempt
            .as_ref()
            .map(|a| format!(
                "{} (residency epoch {}, journal epoch {})",
                a.id, a.residency_epoch.0, a.journal_epoch.0
            ))
            .unwrap_or_else(|| "none".into()),
        c.evidence_seq
            .map(|s| s.to_string())
            .unwrap_or_else(|| "-".into()),
        c.epoch_mark.0
    )
}

/// The rules the store's state alone can be held to.
fn store_rules(s: &SessionView, read_at_ms: i64, found: &mut Vec<Violation>) {
    let frames = s.dispositions();
    let effects = s.effects();
    let mut applied_in_order: Vec<(&CommandRecord, u64)> = Vec::new();
    for c in &s.commands {
        let mine = frames.get(&c.runtime_command).cloned().unwrap_or_default();
        if !c.state.is_terminal() {
            let deadline = if read_at_ms >= c.apply_deadline_ms {
                format!(
                    "its apply deadline passed {} ms before",
                    read_at_ms - c.apply_deadline_ms
                )
            } else {
                format!(
                    "{} ms before its apply deadline",
                    c.apply_deadline_ms - read_at_ms
                )
            };
            found.push(violation(
                ViolationKind::Wedged,
                s,
                Some(&c.command),
                format!(
                    "not ended when checked ({deadline}; admitted {} ms before): {}; claim {:?}",
                    read_at_ms - c.admitted_at_ms,
                    brief(c),
                    c.claim
                ),
            ));
        }
        if mine.len() > 1 {
            let seqs: Vec<String> = mine
                .iter()
                .map(|f| format!("seq {} {} attempt {}", f.seq, f.disposition, f.attempt))
                .collect();
            found.push(violation(
                ViolationKind::DuplicateDisposition,
                s,
                Some(&c.command),
                format!("{} dispositions: {}", mine.len(), seqs.join("; ")),
            ));
        }
        if c.state.is_terminal() {
            match &c.attempt {
                Some(a) => {
                    let proven = mine.iter().find(|f| Some(f.seq) == c.evidence_seq);
                    match proven {
                        Some(f)
                            if f.attempt == a.id
                                && Some(f.disposition.outcome()) == c.outcome
                                && f.disposition.terminal_state() == c.state => {}
                        Some(f) => found.push(violation(
                            ViolationKind::EvidenceMismatch,
                            s,
                            Some(&c.command),
                            format!(
                                "{}; its evidence frame seq {} says {} for attempt {}",
                                brief(c),
                                f.seq,
                                f.disposition,
                                f.attempt
                            ),
                        )),
                        None => found.push(violation(
                            ViolationKind::EvidenceMismatch,
                            s,
                            Some(&c.command),
                            format!(
                                "{}; the journal holds no disposition at that sequence ({} for this command)",
                                brief(c),
                                mine.len()
                            ),
                        )),
                    }
                }
                None => {
                    if c.outcome != Some(Outcome::Rejected) || !mine.is_empty() {
                        found.push(violation(
                            ViolationKind::EvidenceMismatch,
                            s,
                            Some(&c.command),
                            format!(
                                "ended without an attempt: {}; {} dispositions in the journal",
                                brief(c),
                                mine.len()
                            ),
                        ));
                    }
                }
            }
        }
        let caused = effects.get(&c.runtime_command).copied().unwrap_or(0);
        if c.state.is_terminal() && c.outcome != Some(Outcome::Applied) && caused > 0 {
            found.push(violation(
                ViolationKind::EffectNotApplied,
                s,
                Some(&c.command),
                format!(
                    "{}; yet {caused} journal records name it as their cause",
                    brief(c)
                ),
            ));
        }
        if let Some(f) = mine.first() {
            applied_in_order.push((c, f.seq));
        }
    }
    // Dispositions in acceptance order (commands are listed in it).
    for pair in applied_in_order.windows(2) {
        let ((a, a_seq), (b, b_seq)) = (pair[0], pair[1]);
        if b_seq < a_seq {
            found.push(violation(
                ViolationKind::OutOfOrder,
                s,
                Some(&b.command),
                format!(
                    "accepted after {} (#{} then #{}) but its disposition is at seq {b_seq}, before {}'s at seq {a_seq}",
                    a.command, a.accepted_order, b.accepted_order, a.command
                ),
            ));
        }
    }
    let known: std::collections::HashSet<_> =
        s.commands.iter().map(|c| c.runtime_command).collect();
    for (rc, fs) in &frames {
        if !known.contains(rc) {
            for f in fs {
                found.push(violation(
                    ViolationKind::OrphanEvidence,
                    s,
                    Some(&f.identity.command),
                    format!(
                        "journal seq {} holds {} for runtime command {rc}, which the session does not have",
                        f.seq, f.disposition
                    ),
                ));
            }
        }
    }
}

/// The rules that hold the store to what clients saw.
fn client_rules(s: &SessionView, client: &ClientSession, found: &mut Vec<Violation>) {
    for id in &client.order {
        let c = &client.commands[id];
        let stored = s.command(id);
        let Some(rec) = stored else {
            if !c.acked.is_empty() {
                found.push(violation(
                    ViolationKind::Lost,
                    s,
                    Some(id),
                    format!(
                        "acknowledged {} times (orders {:?}); the store has no such command",
                        c.acked.len(),
                        c.acked.iter().flatten().collect::<Vec<_>>()
                    ),
                ));
            }
            continue;
        };
        if let Some(order) = c.acked.iter().flatten().find(|o| **o != rec.accepted_order) {
            found.push(violation(
                ViolationKind::ObservationContradicted,
                s,
                Some(id),
                format!(
                    "acknowledged at order {order}; the store holds it at {}",
                    rec.accepted_order
                ),
            ));
        }
        if c.refused && c.acked.is_empty() && !c.uncertain {
            found.push(violation(
                ViolationKind::ObservationContradicted,
                s,
                Some(id),
                format!(
                    "its admission was refused (nothing admitted), yet the store holds it: {}",
                    brief(rec)
                ),
            ));
        }
        for seen in &c.observed {
            if Some(*seen) != rec.outcome {
                found.push(violation(
                    ViolationKind::ObservationContradicted,
                    s,
                    Some(id),
                    format!("a client observed {seen}; the store says {}", brief(rec)),
                ));
            }
        }
        if let Some((before, order)) = &c.after_acked
            && rec.accepted_order <= *order
        {
            found.push(violation(
                ViolationKind::OutOfOrder,
                s,
                Some(id),
                format!(
                    "invoked after {before} was acknowledged at order {order}, yet accepted at order {}",
                    rec.accepted_order
                ),
            ));
        }
    }
}

/// Markers: each applied command carrying one shows it once; nothing else shows it.
fn marker_rules(s: &SessionView, client: &ClientSession, found: &mut Vec<Violation>) {
    let mut by_marker: BTreeMap<&str, Vec<(&CommandId, Option<CommandKind>)>> = BTreeMap::new();
    for id in &client.order {
        let c = &client.commands[id];
        if let Some(m) = c.marker.as_deref() {
            by_marker.entry(m).or_default().push((id, c.kind));
        }
    }
    let markers: Vec<&str> = by_marker.keys().copied().collect();
    for m in &markers {
        if let Some(outer) = markers.iter().find(|o| *o != m && o.contains(m)) {
            found.push(violation(
                ViolationKind::BadHistory,
                s,
                None,
                format!(
                    "marker {m:?} is a part of marker {outer:?}: their effects cannot be told apart"
                ),
            ));
        }
    }
    let events = s.public_events();
    for (marker, carriers) in &by_marker {
        let applied: Vec<&CommandId> = carriers
            .iter()
            .filter(|(id, _)| s.command(id).and_then(|c| c.outcome) == Some(Outcome::Applied))
            .map(|(id, _)| *id)
            .collect();
        let shown = |kind: &str| -> Vec<u64> {
            events
                .iter()
                .filter(|e| e.kind() == kind && e.text().is_some_and(|t| t.contains(marker)))
                .map(|e| e.seq)
                .collect()
        };
        let messages = shown("user_message");
        let tools = shown("tool_result");
        let outcomes: Vec<String> = carriers
            .iter()
            .map(|(id, _)| {
                format!(
                    "{id}: {}",
                    s.command(id)
                        .map(|c| c.outcome.map(|o| o.as_str()).unwrap_or(c.state.as_str()))
                        .unwrap_or("not in the store")
                )
            })
            .collect();
        let first = carriers.first().map(|(id, _)| *id);
        if applied.len() > 1 {
            found.push(violation(
                ViolationKind::MarkerAppliedTwice,
                s,
                applied.get(1).copied(),
                format!(
                    "marker {marker:?} applied by {} commands: {}",
                    applied.len(),
                    outcomes.join(", ")
                ),
            ));
        }
        for (what, seqs) in [("user message", &messages), ("tool result", &tools)] {
            if seqs.len() > applied.len() {
                let kind = if applied.is_empty() {
                    ViolationKind::EffectNotApplied
                } else {
                    ViolationKind::MarkerAppliedTwice
                };
                found.push(violation(
                    kind,
                    s,
                    applied.first().copied().or(first),
                    format!(
                        "marker {marker:?} is in {} {what}s (journal seqs {seqs:?}), {} of its commands applied: {}",
                        seqs.len(),
                        applied.len(),
                        outcomes.join(", ")
                    ),
                ));
            }
        }
        let inputs_applied = carriers
            .iter()
            .filter(|(id, kind)| {
                matches!(kind, Some(CommandKind::Input) | Some(CommandKind::Create))
                    && applied.contains(id)
            })
            .count();
        if messages.len() < inputs_applied {
            found.push(violation(
                ViolationKind::MarkerMissing,
                s,
                applied.first().copied(),
                format!(
                    "marker {marker:?}: {inputs_applied} applied inputs carry it, {} user messages show it: {}",
                    messages.len(),
                    outcomes.join(", ")
                ),
            ));
        }
    }
}

fn summarize(history: &History, view: &StoreView, clients: &ClientView) -> Summary {
    let mut summary = Summary {
        sessions: view.sessions.len(),
        faults: history.faults_by_kind(),
        ..Summary::default()
    };
    for s in clients.sessions.values() {
        for c in s.commands.values() {
            if !c.acked.is_empty() {
                summary.admitted += 1;
            } else if c.uncertain {
                summary.uncertain += 1;
            } else if c.refused {
                summary.refused += 1;
            }
        }
    }
    for s in &view.sessions {
        for c in &s.commands {
            let key = match c.outcome {
                Some(o) => o.as_str().to_owned(),
                None => format!("not ended ({})", c.state),
            };
            *summary.by_outcome.entry(key).or_default() += 1;
        }
    }
    summary
}
