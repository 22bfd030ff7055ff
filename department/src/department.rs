//! The Department: an immutable, validated set of registrations (agent → launch target).
//! Validated once at construction; never changes afterwards.

use std::collections::BTreeMap;
use std::sync::Arc;

use sessionstore::AgentId;

use crate::capabilities::RuntimeProfile;
use crate::launch::LaunchTarget;

/// One agent and the target that launches it.
#[derive(Clone)]
pub struct Registration {
    pub agent: AgentId,
    pub target: Arc<dyn LaunchTarget>,
}

/// Why a department could not be built or composed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DepartmentError {
    #[error("empty: a department needs at least one agent")]
    Empty,
    #[error("duplicate: agent {0} is registered twice")]
    Duplicate(AgentId),
    /// Under the durable profile, targets that do not declare full recovery.
    #[error("undeclared_recovery: {}", describe(.0))]
    UndeclaredRecovery(Vec<(AgentId, Vec<&'static str>)>),
}

fn describe(v: &[(AgentId, Vec<&'static str>)]) -> String {
    v.iter()
        .map(|(a, missing)| format!("agent {a} lacks {}", missing.join(" and ")))
        .collect::<Vec<_>>()
        .join("; ")
}

impl DepartmentError {
    /// A stable code.
    pub fn code(&self) -> &'static str {
        match self {
            DepartmentError::Empty => "empty",
            DepartmentError::Duplicate(_) => "duplicate",
            DepartmentError::UndeclaredRecovery(_) => "undeclared_recovery",
        }
    }
}

/// The immutable set of agents a Host serves.
#[derive(Clone)]
pub struct Department {
    targets: BTreeMap<AgentId, Arc<dyn LaunchTarget>>,
}

impl std::fmt::Debug for Department {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Department")
            .field("agents", &self.targets.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Department {
    /// Validates the registrations: at least one, no agent twice.
    pub fn new(registrations: Vec<Registration>) -> Result<Department, DepartmentError> {
        if registrations.is_empty() {
            return Err(DepartmentError::Empty);
        }
        let mut targets = BTreeMap::new();
        for r in registrations {
            if targets.contains_key(&r.agent) {
                return Err(DepartmentError::Duplicate(r.agent));
            }
            targets.insert(r.agent, r.target);
        }
        Ok(Department { targets })
    }

    /// The target registered for `agent`.
    pub fn target(&self, agent: &AgentId) -> Option<Arc<dyn LaunchTarget>> {
        self.targets.get(agent).cloned()
    }

    /// The registered agents, in order.
    pub fn agents(&self) -> impl Iterator<Item = &AgentId> {
        self.targets.keys()
    }

    /// Checks every target against `profile`: under `Durable`, refuses (naming each agent and
    /// what it lacks) any target without full recovery; under `BestEffort`, logs one warning
    /// naming them and admits them.
    pub fn check_profile(&self, profile: RuntimeProfile) -> Result<(), DepartmentError> {
        let lacking: Vec<(AgentId, Vec<&'static str>)> = self
            .targets
            .iter()
            .filter_map(|(agent, t)| {
                let r = t.capabilities().recovery;
                (!r.is_full()).then(|| (agent.clone(), r.missing()))
            })
            .collect();
        if lacking.is_empty() {
            return Ok(());
        }
        match profile {
            RuntimeProfile::Durable => Err(DepartmentError::UndeclaredRecovery(lacking)),
            RuntimeProfile::BestEffort => {
                tracing::warn!(
                    targets = %describe(&lacking),
                    "best-effort runtime profile: these targets cannot recover from a crash; a failover with an attempt in flight can wedge a session and a journal fault leaves it refusing every command"
                );
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capabilities::{Capabilities, Recovery};
    use crate::launch::{LaunchError, LaunchRequest};
    use crate::runtime::Runtime;
    use sessionstore::CompatibilityId;

    /// A target that only declares; these tests never launch.
    struct Declares(Recovery);

    #[async_trait::async_trait]
    impl LaunchTarget for Declares {
        fn capabilities(&self) -> Capabilities {
            Capabilities {
                recovery: self.0,
                ..Capabilities::default()
            }
        }
        fn compatibility(&self) -> CompatibilityId {
            CompatibilityId::new("c").unwrap()
        }
        async fn launch(&self, _request: LaunchRequest) -> Result<Runtime, LaunchError> {
            Err(LaunchError::NoConversation)
        }
    }

    fn reg(agent: &str, r: Recovery) -> Registration {
        Registration {
            agent: AgentId::new(agent).unwrap(),
            target: Arc::new(Declares(r)),
        }
    }

    #[test]
    fn an_empty_department_is_refused() {
        assert_eq!(Department::new(vec![]).unwrap_err(), DepartmentError::Empty);
    }

    #[test]
    fn an_agent_registered_twice_is_refused() {
        let err = Department::new(vec![reg("a", Recovery::full()), reg("a", Recovery::full())])
            .unwrap_err();
        assert_eq!(err.code(), "duplicate");
        assert!(err.to_string().contains("agent a"));
    }

    #[test]
    fn the_durable_profile_names_every_agent_and_what_it_lacks() {
        let d = Department::new(vec![
            reg("ok", Recovery::full()),
            reg("bare", Recovery::default()),
            reg(
                "half",
                Recovery {
                    attempt_closer: true,
                    persistence_faults: false,
                },
            ),
        ])
        .unwrap();
        let err = d.check_profile(RuntimeProfile::Durable).unwrap_err();
        let DepartmentError::UndeclaredRecovery(list) = &err else {
            panic!("{err}");
        };
        assert_eq!(list.len(), 2);
        let text = err.to_string();
        assert!(
            text.contains("agent bare lacks attempt_closer and persistence_faults"),
            "{text}"
        );
        assert!(
            text.contains("agent half lacks persistence_faults"),
            "{text}"
        );
        assert!(d.check_profile(RuntimeProfile::BestEffort).is_ok());
        assert_eq!(RuntimeProfile::default(), RuntimeProfile::Durable);
    }

    #[test]
    fn a_department_finds_its_targets_by_agent() {
        let d = Department::new(vec![reg("a", Recovery::full())]).unwrap();
        assert!(d.target(&AgentId::new("a").unwrap()).is_some());
        assert!(d.target(&AgentId::new("b").unwrap()).is_none());
        assert_eq!(d.agents().count(), 1);
    }
}
