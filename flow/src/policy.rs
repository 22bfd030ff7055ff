//! The start policy: given the run graph of a flow and where each service stands, which
//! services may be started now and which can never start because a prerequisite failed.
//!
//! This module owns that decision as a pure function. It must never perform an action (the
//! engine does), and it reads only the run stage: build-stage and external edges never order
//! a start.

use crate::graph::{StageGraph, Wait};

/// Where a service stands, as far as its consumers are concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Standing {
    /// Not started yet.
    Pending,
    /// Started, not yet ready (or between restarts).
    Starting,
    /// Passed readiness (a service without endpoints: started and not failed).
    Healthy,
    /// A one-shot job that exited with status 0.
    Completed,
    /// Will not become healthy or complete; the text says why.
    Failed(String),
}

/// What the engine should do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Every prerequisite of the service is satisfied: Init and Start it.
    Start(String),
    /// A prerequisite failed, so the service can never start.
    Block { service: String, reason: String },
}

/// The run-stage start policy over one flow's graph.
#[derive(Debug, Clone)]
pub struct StartPolicy<'g> {
    graph: &'g StageGraph,
}

impl<'g> StartPolicy<'g> {
    pub fn new(graph: &'g StageGraph) -> Self {
        StartPolicy { graph }
    }

    /// The actions due now, in declaration order. Services of one layer come out together,
    /// so the engine starts them concurrently.
    pub fn next(&self, standing: impl Fn(&str) -> Standing) -> Vec<Action> {
        let mut actions = Vec::new();
        for service in self.graph.nodes() {
            if standing(service) != Standing::Pending {
                continue;
            }
            let mut ready = true;
            let mut blocked: Option<String> = None;
            for edge in self.graph.prerequisites(service) {
                let producer = standing(&edge.producer);
                let satisfied = match edge.kind.wait() {
                    Wait::Nothing => true,
                    Wait::Healthy => producer == Standing::Healthy,
                    Wait::Completed => producer == Standing::Completed,
                };
                if satisfied {
                    continue;
                }
                ready = false;
                if let Standing::Failed(why) = producer {
                    blocked = Some(format!(
                        "its {} dependency `{}` {why}",
                        edge.kind.as_str(),
                        edge.producer
                    ));
                    break;
                }
            }
            match (blocked, ready) {
                (Some(reason), _) => actions.push(Action::Block {
                    service: service.clone(),
                    reason,
                }),
                (None, true) => actions.push(Action::Start(service.clone())),
                (None, false) => {}
            }
        }
        actions
    }

    /// Whether every service of the flow is healthy or completed.
    pub fn is_up(&self, standing: impl Fn(&str) -> Standing) -> bool {
        self.graph
            .nodes()
            .iter()
            .all(|s| matches!(standing(s), Standing::Healthy | Standing::Completed))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::graph::{Edge, EdgeOrigin, Stage};
    use crate::manifest::DependencyKind;

    fn graph(nodes: &[&str], edges: &[(&str, &str, DependencyKind)]) -> StageGraph {
        let mut g = StageGraph::new(Stage::Run, nodes.iter().map(|s| s.to_string()).collect());
        for (c, p, k) in edges {
            g.add_edge(Edge {
                consumer: c.to_string(),
                producer: p.to_string(),
                kind: *k,
                endpoints: vec![],
                origin: EdgeOrigin::Declared,
            })
            .unwrap();
        }
        g
    }

    fn standings(pairs: &[(&str, Standing)]) -> impl Fn(&str) -> Standing {
        let map: HashMap<String, Standing> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        move |s: &str| map.get(s).cloned().unwrap_or(Standing::Pending)
    }

    #[test]
    fn independent_services_of_one_layer_are_started_together() {
        let g = graph(
            &["db", "cache", "api"],
            &[
                ("api", "db", DependencyKind::Runtime),
                ("api", "cache", DependencyKind::Legacy),
            ],
        );
        let p = StartPolicy::new(&g);
        assert_eq!(
            p.next(standings(&[])),
            vec![Action::Start("db".into()), Action::Start("cache".into())]
        );
        assert_eq!(
            p.next(standings(&[
                ("db", Standing::Healthy),
                ("cache", Standing::Starting)
            ])),
            vec![]
        );
        assert_eq!(
            p.next(standings(&[
                ("db", Standing::Healthy),
                ("cache", Standing::Healthy)
            ])),
            vec![Action::Start("api".into())]
        );
    }

    #[test]
    fn a_completion_dependency_waits_for_completion_not_health() {
        let g = graph(
            &["migrate", "api"],
            &[("api", "migrate", DependencyKind::Completion)],
        );
        let p = StartPolicy::new(&g);
        assert_eq!(p.next(standings(&[("migrate", Standing::Healthy)])), vec![]);
        assert_eq!(
            p.next(standings(&[("migrate", Standing::Completed)])),
            vec![Action::Start("api".into())]
        );
    }

    #[test]
    fn a_failed_job_blocks_its_consumers_with_its_reason() {
        let g = graph(
            &["migrate", "api"],
            &[("api", "migrate", DependencyKind::Completion)],
        );
        let p = StartPolicy::new(&g);
        let actions = p.next(standings(&[(
            "migrate",
            Standing::Failed("exited with status 3".into()),
        )]));
        assert_eq!(
            actions,
            vec![Action::Block {
                service: "api".into(),
                reason: "its completion dependency `migrate` exited with status 3".into()
            }]
        );
    }

    #[test]
    fn the_flow_is_up_when_everything_is_healthy_or_completed() {
        let g = graph(
            &["migrate", "api"],
            &[("api", "migrate", DependencyKind::Completion)],
        );
        let p = StartPolicy::new(&g);
        assert!(!p.is_up(standings(&[
            ("migrate", Standing::Completed),
            ("api", Standing::Starting)
        ])));
        assert!(p.is_up(standings(&[
            ("migrate", Standing::Completed),
            ("api", Standing::Healthy)
        ])));
    }
}
