//! Declared capabilities of a launch target and the runtime profile that decides which
//! declarations a Host insists on. Plain data; never launches anything.

/// What a target's runtime can do to recover from a crash: close a predecessor's stranded
/// attempt, and report a persistence fault (and be abandoned crash-equivalently).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct Recovery {
    pub attempt_closer: bool,
    pub persistence_faults: bool,
}

impl Recovery {
    /// Both recovery capabilities.
    pub fn full() -> Recovery {
        Recovery {
            attempt_closer: true,
            persistence_faults: true,
        }
    }

    /// True when both are declared.
    pub fn is_full(&self) -> bool {
        self.attempt_closer && self.persistence_faults
    }

    /// The names of what is missing, in a stable order.
    pub fn missing(&self) -> Vec<&'static str> {
        let mut out = Vec::new();
        if !self.attempt_closer {
            out.push("attempt_closer");
        }
        if !self.persistence_faults {
            out.push("persistence_faults");
        }
        out
    }
}

/// What a target declares about itself.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Capabilities {
    /// May share a pooled Host with other sessions.
    pub supports_pooled: bool,
    /// How much of a Host's capacity one session of this target uses (at least 1).
    pub admission_weight: u32,
    /// The isolation class this target requires of a Host ("" = any).
    pub isolation: String,
    /// Crash recovery.
    pub recovery: Recovery,
}

impl Default for Capabilities {
    fn default() -> Self {
        Capabilities {
            supports_pooled: true,
            admission_weight: 1,
            isolation: String::new(),
            recovery: Recovery::default(),
        }
    }
}

/// Which recovery a Host requires of every target it composes.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub enum RuntimeProfile {
    /// Every target must declare full recovery; a target that does not is refused at
    /// composition. The default.
    #[default]
    Durable,
    /// Targets without recovery are admitted (for experiments and fakes); the Host logs one
    /// warning.
    BestEffort,
}
