//! A recorded history: what the clients of a test did and saw, in the order they did it, as
//! one timeline — each command invoked (with the marker its body carries), whether its
//! admission was acknowledged, refused or left uncertain, the outcome a client observed or the
//! wait it gave up on, and every fault injected or healed along the way. The seed that chose
//! the run is kept with it, so a report can say how to replay it.
//!
//! A [`Recorder`] is cheap to clone and safe to share between client tasks; each records what
//! it does *as it does it* (an invocation before the call, its result after), so the order of
//! the entries is the real order of the events. [`crate::checker::check`] reads a [`History`]
//! beside the store's final state. Owns the entries and their one-line rendering; never reads
//! a store and never judges anything.
//!
//! One history is one tenant's: sessions are named by their id alone.
//!
//! ```
//! use sessionstore::{CommandId, CommandKind, Outcome, SessionId};
//! use testkit::history::Recorder;
//!
//! let history = Recorder::new(Some(42));
//! let (s, c) = (SessionId::new("s-1").unwrap(), CommandId::new("c-1").unwrap());
//! history.invoke(&s, &c, CommandKind::Input, Some("marker-1"));
//! history.admitted(&s, &c, 7);
//! history.fault("kill", "host-a (pid 1234)");
//! history.observed(&s, &c, Outcome::Applied);
//! assert_eq!(history.history().entries.len(), 4);
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sessionstore::{CommandId, CommandKind, Outcome, SessionId};

/// What happened, as a client (or the fault injector) saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A client is about to admit `command`. `marker` is a text its body carries that no
    /// other command's body carries (resends of the same payload excepted), so its effect can
    /// be counted in the journal; it must not be a part of another marker.
    Invoke {
        command: CommandId,
        kind: CommandKind,
        marker: Option<String>,
    },
    /// The admission was acknowledged: the command is durable, at `accepted_order` when the
    /// client was told it (a command-line client is told only that it was admitted).
    Admitted {
        command: CommandId,
        accepted_order: Option<u64>,
    },
    /// The admission was refused: nothing was admitted.
    Refused { command: CommandId, code: String },
    /// The admission's fate is unknown to the client (a timeout, a cut link, a crash): it may
    /// or may not be durable.
    Uncertain { command: CommandId, why: String },
    /// The client observed the command's outcome.
    Observed {
        command: CommandId,
        outcome: Outcome,
    },
    /// The client stopped waiting for the command's outcome (it did not learn it).
    GaveUp { command: CommandId, why: String },
    /// A fault was injected or healed; `kind` groups faults in a summary (`kill`, `heal`...).
    Fault { kind: String, detail: String },
    /// Anything else worth reading when the run is replayed.
    Note { text: String },
}

impl Event {
    /// The command this event is about, if any.
    pub fn command(&self) -> Option<&CommandId> {
        match self {
            Event::Invoke { command, .. }
            | Event::Admitted { command, .. }
            | Event::Refused { command, .. }
            | Event::Uncertain { command, .. }
            | Event::Observed { command, .. }
            | Event::GaveUp { command, .. } => Some(command),
            Event::Fault { .. } | Event::Note { .. } => None,
        }
    }
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Event::Invoke {
                command,
                kind,
                marker,
            } => {
                write!(f, "invoke {kind} {command}")?;
                if let Some(m) = marker {
                    write!(f, " marker {m}")?;
                }
                Ok(())
            }
            Event::Admitted {
                command,
                accepted_order: Some(order),
            } => write!(f, "admitted {command} at order {order}"),
            Event::Admitted {
                command,
                accepted_order: None,
            } => write!(f, "admitted {command}"),
            Event::Refused { command, code } => write!(f, "refused {command}: {code}"),
            Event::Uncertain { command, why } => write!(f, "uncertain {command}: {why}"),
            Event::Observed { command, outcome } => write!(f, "observed {command}: {outcome}"),
            Event::GaveUp { command, why } => write!(f, "gave up on {command}: {why}"),
            Event::Fault { kind, detail } => write!(f, "FAULT {kind}: {detail}"),
            Event::Note { text } => write!(f, "note: {text}"),
        }
    }
}

/// One entry of the timeline.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Since the recorder was made.
    pub at: Duration,
    /// The session it concerns (`None` for faults and global notes).
    pub session: Option<SessionId>,
    pub event: Event,
}

impl fmt::Display for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:>9.3}s ", self.at.as_secs_f64())?;
        if let Some(s) = &self.session {
            write!(f, "[{s}] ")?;
        }
        write!(f, "{}", self.event)
    }
}

/// A snapshot of what was recorded.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct History {
    /// The seed the run was chosen by, when it was.
    pub seed: Option<u64>,
    pub entries: Vec<Entry>,
}

impl History {
    /// No client events at all: the checker then judges the store's state alone.
    pub fn empty() -> History {
        History::default()
    }

    /// The entries about `session`, with every fault and global note between them, in order.
    pub fn timeline<'a>(&'a self, session: &'a SessionId) -> impl Iterator<Item = &'a Entry> + 'a {
        self.entries
            .iter()
            .filter(move |e| e.session.as_ref().is_none_or(|s| s == session))
    }

    /// How many faults of each kind were recorded.
    pub fn faults_by_kind(&self) -> BTreeMap<String, usize> {
        let mut out = BTreeMap::new();
        for e in &self.entries {
            if let Event::Fault { kind, .. } = &e.event {
                *out.entry(kind.clone()).or_default() += 1;
            }
        }
        out
    }
}

impl fmt::Display for History {
    /// Every entry, one per line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(seed) = self.seed {
            writeln!(f, "seed {seed}")?;
        }
        for e in &self.entries {
            writeln!(f, "{e}")?;
        }
        Ok(())
    }
}

struct Log {
    started: Instant,
    history: History,
}

/// Records a history; clones share one timeline.
#[derive(Clone)]
pub struct Recorder {
    log: Arc<Mutex<Log>>,
}

impl Recorder {
    /// A new, empty timeline that starts now, for a run chosen by `seed` (if any).
    pub fn new(seed: Option<u64>) -> Recorder {
        Recorder {
            log: Arc::new(Mutex::new(Log {
                started: Instant::now(),
                history: History {
                    seed,
                    entries: Vec::new(),
                },
            })),
        }
    }

    fn push(&self, session: Option<&SessionId>, event: Event) {
        let mut log = match self.log.lock() {
            Ok(l) => l,
            Err(poisoned) => poisoned.into_inner(),
        };
        let at = log.started.elapsed();
        log.history.entries.push(Entry {
            at,
            session: session.cloned(),
            event,
        });
    }

    /// A client is about to admit `command` (see [`Event::Invoke`]).
    pub fn invoke(
        &self,
        session: &SessionId,
        command: &CommandId,
        kind: CommandKind,
        marker: Option<&str>,
    ) {
        self.push(
            Some(session),
            Event::Invoke {
                command: command.clone(),
                kind,
                marker: marker.map(str::to_owned),
            },
        );
    }

    /// The admission was acknowledged at `accepted_order`.
    pub fn admitted(&self, session: &SessionId, command: &CommandId, accepted_order: u64) {
        self.push(
            Some(session),
            Event::Admitted {
                command: command.clone(),
                accepted_order: Some(accepted_order),
            },
        );
    }

    /// The admission was acknowledged, without its order (a command-line client's view).
    pub fn admitted_unordered(&self, session: &SessionId, command: &CommandId) {
        self.push(
            Some(session),
            Event::Admitted {
                command: command.clone(),
                accepted_order: None,
            },
        );
    }

    /// The admission was refused; nothing was admitted.
    pub fn refused(&self, session: &SessionId, command: &CommandId, code: impl Into<String>) {
        self.push(
            Some(session),
            Event::Refused {
                command: command.clone(),
                code: code.into(),
            },
        );
    }

    /// The admission may or may not have become durable.
    pub fn uncertain(&self, session: &SessionId, command: &CommandId, why: impl Into<String>) {
        self.push(
            Some(session),
            Event::Uncertain {
                command: command.clone(),
                why: why.into(),
            },
        );
    }

    /// The client observed `outcome`.
    pub fn observed(&self, session: &SessionId, command: &CommandId, outcome: Outcome) {
        self.push(
            Some(session),
            Event::Observed {
                command: command.clone(),
                outcome,
            },
        );
    }

    /// The client stopped waiting for the outcome.
    pub fn gave_up(&self, session: &SessionId, command: &CommandId, why: impl Into<String>) {
        self.push(
            Some(session),
            Event::GaveUp {
                command: command.clone(),
                why: why.into(),
            },
        );
    }

    /// A fault injected or healed.
    pub fn fault(&self, kind: impl Into<String>, detail: impl Into<String>) {
        self.push(
            None,
            Event::Fault {
                kind: kind.into(),
                detail: detail.into(),
            },
        );
    }

    /// A note, about a session or (with `None`) the whole run.
    pub fn note(&self, session: Option<&SessionId>, text: impl Into<String>) {
        self.push(session, Event::Note { text: text.into() });
    }

    /// What was recorded so far.
    pub fn history(&self) -> History {
        match self.log.lock() {
            Ok(l) => l.history.clone(),
            Err(poisoned) => poisoned.into_inner().history.clone(),
        }
    }
}
