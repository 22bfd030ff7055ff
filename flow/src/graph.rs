//! The dependency model: typed edge kinds, the two stage graphs (build and run) each sorted
//! and checked for cycles on its own, phases decomposed into ordered stages, and restriction
//! to one target's closure.
//!
//! This module owns the shape of the graph and nothing that runs: it must never start,
//! probe or stop a service, and it must never merge the two stages (their union may hold a
//! legitimate cycle). An unknown stage, phase or service is an error, never an empty answer.

use std::collections::{BTreeSet, HashMap};
use std::str::FromStr;

use wire_enum::wire_enum;

use crate::error::GraphError;
use crate::manifest::{DependencyKind, Workspace};

/// What a consumer waits for before it starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    Nothing,
    /// The producer passed its readiness predicates (or, with no endpoints, started).
    Healthy,
    /// The producer exited with status 0.
    Completed,
}

/// What each declared kind means for the graph: the stages it constrains, the endpoints it
/// uses and what the consumer waits for.
impl DependencyKind {
    /// The stages whose graph holds an edge of this kind.
    pub fn stages(self) -> &'static [Stage] {
        match self {
            DependencyKind::Legacy => &[Stage::Build, Stage::Run],
            DependencyKind::Build | DependencyKind::Schema => &[Stage::Build],
            DependencyKind::Runtime | DependencyKind::Completion => &[Stage::Run],
            DependencyKind::External => &[],
        }
    }

    /// Whether the edge uses the producer's endpoints at all (calls them or reads their
    /// contract). An edge that consumes nothing selects no endpoint, whatever it names.
    pub fn consumes_endpoints(self) -> bool {
        matches!(
            self,
            DependencyKind::Legacy
                | DependencyKind::Build
                | DependencyKind::Schema
                | DependencyKind::Runtime
        )
    }

    /// Whether the consumer calls the producer's endpoints at run time, and so is handed
    /// their addresses.
    pub fn reaches_endpoints(self) -> bool {
        matches!(self, DependencyKind::Legacy | DependencyKind::Runtime)
    }

    pub fn wait(self) -> Wait {
        match self {
            DependencyKind::Legacy | DependencyKind::Runtime => Wait::Healthy,
            DependencyKind::Completion => Wait::Completed,
            DependencyKind::Build | DependencyKind::Schema | DependencyKind::External => {
                Wait::Nothing
            }
        }
    }
}

wire_enum! {
    /// An elementary graph that can be sorted.
    #[derive(PartialOrd, Ord)]
    pub enum Stage {
        Build = "build",
        Run = "run",
    }
    kind = "stage";
}

impl FromStr for Stage {
    type Err = GraphError;
    fn from_str(s: &str) -> Result<Self, GraphError> {
        Stage::from_wire(s).map_err(|e| GraphError::UnknownStage(e.value))
    }
}

wire_enum! {
    /// An operation a caller asks for; it decomposes into ordered stages.
    pub enum Phase {
        Build = "build",
        Run = "run",
        Test = "test",
        Deploy = "deploy",
    }
    kind = "phase";
}

impl Phase {
    pub fn stages(self) -> &'static [Stage] {
        match self {
            Phase::Build => &[Stage::Build],
            Phase::Run => &[Stage::Run],
            Phase::Test | Phase::Deploy => &[Stage::Build, Stage::Run],
        }
    }
}

impl FromStr for Phase {
    type Err = GraphError;
    fn from_str(s: &str) -> Result<Self, GraphError> {
        Phase::from_wire(s).map_err(|e| GraphError::UnknownPhase(e.value))
    }
}

/// Where an edge came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EdgeOrigin {
    /// A `dependencies:` entry of the consumer's manifest.
    Declared,
    /// An `${endpoint:...}` reference in the consumer's env variable `key`.
    Reference { key: String },
}

/// `consumer` depends on `producer`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edge {
    pub consumer: String,
    pub producer: String,
    pub kind: DependencyKind,
    /// The producer endpoints named; empty means all of them for a consuming kind.
    pub endpoints: Vec<String>,
    pub origin: EdgeOrigin,
}

/// One stage's graph: nodes in declaration order and the edges of that stage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StageGraph {
    stage: Stage,
    nodes: Vec<String>,
    edges: Vec<Edge>,
    /// Membership-only edges: the consumer's run includes the producer, but does not wait
    /// for it (a reference that would close a startup cycle). They never order anything.
    members: Vec<Edge>,
}

impl StageGraph {
    pub fn new(stage: Stage, nodes: Vec<String>) -> Self {
        StageGraph {
            stage,
            nodes,
            edges: Vec::new(),
            members: Vec::new(),
        }
    }

    /// Adds a membership-only edge (see [`members`](Self::members)).
    pub fn add_member_edge(&mut self, edge: Edge) -> Result<(), GraphError> {
        for end in [&edge.consumer, &edge.producer] {
            if !self.contains(end) {
                return Err(GraphError::UnknownService(end.clone()));
            }
        }
        self.members.push(edge);
        Ok(())
    }

    /// Edges that pull their producer into the consumer's run without ordering it: an
    /// `${endpoint:...}` reference whose producer itself (transitively) depends on the
    /// consumer. Adding it as an ordering edge would close a cycle; since every address is
    /// allocated before anything starts, the reference resolves anyway.
    pub fn members(&self) -> &[Edge] {
        &self.members
    }

    /// Whether `from` reaches `to` by following prerequisite edges (`from` depends on `to`,
    /// directly or through others).
    pub fn depends_on(&self, from: &str, to: &str) -> bool {
        let mut seen: BTreeSet<&str> = BTreeSet::new();
        let mut stack = vec![from];
        while let Some(node) = stack.pop() {
            if node == to {
                return true;
            }
            if seen.insert(node) {
                stack.extend(self.prerequisites(node).map(|e| e.producer.as_str()));
            }
        }
        false
    }

    /// Adds an edge between two nodes of the graph (both ends must already be nodes).
    pub fn add_edge(&mut self, edge: Edge) -> Result<(), GraphError> {
        for end in [&edge.consumer, &edge.producer] {
            if !self.contains(end) {
                return Err(GraphError::UnknownService(end.clone()));
            }
        }
        self.edges.push(edge);
        Ok(())
    }

    pub fn stage(&self) -> Stage {
        self.stage
    }

    pub fn nodes(&self) -> &[String] {
        &self.nodes
    }

    pub fn edges(&self) -> &[Edge] {
        &self.edges
    }

    pub fn contains(&self, name: &str) -> bool {
        self.nodes.iter().any(|n| n == name)
    }

    /// The edges `consumer` has onto its producers.
    pub fn prerequisites<'a>(&'a self, consumer: &'a str) -> impl Iterator<Item = &'a Edge> + 'a {
        self.edges.iter().filter(move |e| e.consumer == consumer)
    }

    /// The edges other services have onto `producer`.
    pub fn consumers<'a>(&'a self, producer: &'a str) -> impl Iterator<Item = &'a Edge> + 'a {
        self.edges.iter().filter(move |e| e.producer == producer)
    }

    /// Every service that needs one of `producers` running, directly or through others: the
    /// consumers of edges that wait for health (legacy, runtime), followed transitively. A
    /// `completion` edge is not followed (its job has done its work once it exited), nor is a
    /// membership-only edge (it never orders anything). In declaration order, without the
    /// producers themselves.
    pub fn running_dependents(&self, producers: &[&str]) -> Vec<String> {
        let mut found: BTreeSet<&str> = BTreeSet::new();
        let mut stack: Vec<&str> = producers.to_vec();
        while let Some(producer) = stack.pop() {
            for edge in self.consumers(producer) {
                if edge.kind.wait() == Wait::Healthy && found.insert(edge.consumer.as_str()) {
                    stack.push(edge.consumer.as_str());
                }
            }
        }
        self.nodes
            .iter()
            .filter(|n| found.contains(n.as_str()) && !producers.contains(&n.as_str()))
            .cloned()
            .collect()
    }

    fn index(&self) -> HashMap<&str, usize> {
        self.nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.as_str(), i))
            .collect()
    }

    /// Fails with the stage and the path of the first cycle found (in declaration order).
    pub fn verify_acyclic(&self) -> Result<(), GraphError> {
        let index = self.index();
        let mut out: Vec<Vec<usize>> = vec![Vec::new(); self.nodes.len()];
        for e in &self.edges {
            if let (Some(&c), Some(&p)) = (
                index.get(e.consumer.as_str()),
                index.get(e.producer.as_str()),
            ) {
                out[c].push(p);
            }
        }
        // 0 = unvisited, 1 = on the current path, 2 = done.
        let mut color = vec![0u8; self.nodes.len()];
        for start in 0..self.nodes.len() {
            if color[start] != 0 {
                continue;
            }
            let mut path: Vec<usize> = vec![start];
            let mut cursor: Vec<usize> = vec![0];
            color[start] = 1;
            while let Some(&node) = path.last() {
                let depth = path.len() - 1;
                let next = out[node].get(cursor[depth]).copied();
                cursor[depth] += 1;
                match next {
                    Some(n) if color[n] == 1 => {
                        let from = path.iter().position(|&x| x == n).unwrap_or(0);
                        let mut names: Vec<String> = path[from..]
                            .iter()
                            .map(|&i| self.nodes[i].clone())
                            .collect();
                        names.push(self.nodes[n].clone());
                        return Err(GraphError::Cycle {
                            stage: self.stage.as_str().to_owned(),
                            path: names,
                        });
                    }
                    Some(n) if color[n] == 0 => {
                        color[n] = 1;
                        path.push(n);
                        cursor.push(0);
                    }
                    Some(_) => {}
                    None => {
                        color[node] = 2;
                        path.pop();
                        cursor.pop();
                    }
                }
            }
        }
        Ok(())
    }

    /// Start layers: layer 0 has no prerequisites, every other service sits one layer after
    /// its deepest prerequisite. Within a layer, declaration order.
    pub fn layers(&self) -> Result<Vec<Vec<String>>, GraphError> {
        self.verify_acyclic()?;
        let index = self.index();
        let mut level: Vec<Option<usize>> = vec![None; self.nodes.len()];
        fn level_of(
            graph: &StageGraph,
            index: &HashMap<&str, usize>,
            level: &mut Vec<Option<usize>>,
            node: usize,
        ) -> usize {
            if let Some(l) = level[node] {
                return l;
            }
            let mut deepest = 0;
            for e in graph.prerequisites(&graph.nodes[node]) {
                if let Some(&p) = index.get(e.producer.as_str()) {
                    deepest = deepest.max(level_of(graph, index, level, p) + 1);
                }
            }
            level[node] = Some(deepest);
            deepest
        }
        let mut layers: Vec<Vec<String>> = Vec::new();
        for node in 0..self.nodes.len() {
            let l = level_of(self, &index, &mut level, node);
            if layers.len() <= l {
                layers.resize(l + 1, Vec::new());
            }
            layers[l].push(self.nodes[node].clone());
        }
        Ok(layers)
    }

    /// The flattened start order.
    pub fn order(&self) -> Result<Vec<String>, GraphError> {
        Ok(self.layers()?.into_iter().flatten().collect())
    }

    /// The graph of `roots` and everything they transitively depend on in this stage. Edge
    /// kinds are kept; removed services can no longer be resolved through the result.
    pub fn restrict_to(&self, roots: &[&str]) -> Result<StageGraph, GraphError> {
        let mut keep: BTreeSet<&str> = BTreeSet::new();
        let mut stack: Vec<&str> = Vec::new();
        for root in roots {
            if !self.contains(root) {
                return Err(GraphError::UnknownService((*root).to_owned()));
            }
            stack.push(root);
        }
        while let Some(node) = stack.pop() {
            if keep.insert(node) {
                for e in self.prerequisites(node) {
                    stack.push(e.producer.as_str());
                }
                for e in self.members.iter().filter(|e| e.consumer == node) {
                    stack.push(e.producer.as_str());
                }
            }
        }
        Ok(self.retain(|n| keep.contains(n)))
    }

    /// The graph of `names` alone, without anything they depend on.
    pub fn only(&self, names: &[&str]) -> Result<StageGraph, GraphError> {
        for name in names {
            if !self.contains(name) {
                return Err(GraphError::UnknownService((*name).to_owned()));
            }
        }
        Ok(self.retain(|n| names.contains(&n)))
    }

    /// The graph without `names` (and their edges).
    pub fn without(&self, names: &[&str]) -> StageGraph {
        self.retain(|n| !names.contains(&n))
    }

    fn retain(&self, keep: impl Fn(&str) -> bool) -> StageGraph {
        StageGraph {
            stage: self.stage,
            nodes: self.nodes.iter().filter(|n| keep(n)).cloned().collect(),
            edges: self
                .edges
                .iter()
                .filter(|e| keep(&e.consumer) && keep(&e.producer))
                .cloned()
                .collect(),
            members: self
                .members
                .iter()
                .filter(|e| keep(&e.consumer) && keep(&e.producer))
                .cloned()
                .collect(),
        }
    }

    /// Teardown layers over `participants`: layer 0 is every participant no other participant
    /// depends on; a producer comes one layer after its last consumer, so a shared dependency
    /// is stopped once, after all of them. Within a layer, declaration order. Should a cycle
    /// slip through, its members land together in one final layer rather than leak.
    pub fn teardown_layers(&self, participants: &[String]) -> Vec<Vec<String>> {
        let index = self.index();
        let wanted: BTreeSet<&str> = participants.iter().map(String::as_str).collect();
        let member: Vec<bool> = self
            .nodes
            .iter()
            .map(|n| wanted.contains(n.as_str()))
            .collect();
        // For each participating producer: how many participating consumers must stop first,
        // and for each consumer the producers it frees once it has stopped.
        let mut waiting_on = vec![0usize; self.nodes.len()];
        let mut frees: Vec<Vec<usize>> = vec![Vec::new(); self.nodes.len()];
        for e in &self.edges {
            if let (Some(&c), Some(&p)) = (
                index.get(e.consumer.as_str()),
                index.get(e.producer.as_str()),
            ) && member[c]
                && member[p]
                && c != p
            {
                waiting_on[p] += 1;
                frees[c].push(p);
            }
        }
        let mut current: Vec<usize> = (0..self.nodes.len())
            .filter(|&i| member[i] && waiting_on[i] == 0)
            .collect();
        let mut placed = vec![false; self.nodes.len()];
        let mut layers: Vec<Vec<String>> = Vec::new();
        while !current.is_empty() {
            let mut next = Vec::new();
            for &node in &current {
                placed[node] = true;
                for &p in &frees[node] {
                    waiting_on[p] -= 1;
                    if waiting_on[p] == 0 {
                        next.push(p);
                    }
                }
            }
            layers.push(current.iter().map(|&i| self.nodes[i].clone()).collect());
            next.sort_unstable();
            next.dedup();
            current = next;
        }
        // Should a cycle slip through, its members go in one final layer rather than leak.
        let rest: Vec<String> = (0..self.nodes.len())
            .filter(|&i| member[i] && !placed[i])
            .map(|i| self.nodes[i].clone())
            .collect();
        if !rest.is_empty() {
            layers.push(rest);
        }
        let mut extra: Vec<String> = participants
            .iter()
            .filter(|p| !self.contains(p))
            .cloned()
            .collect();
        if !extra.is_empty() {
            if layers.is_empty() {
                layers.push(Vec::new());
            }
            layers[0].append(&mut extra);
        }
        layers
    }
}

/// The ordered stages of a phase, each with its start layers.
pub type PhaseOrder = Vec<(Stage, Vec<Vec<String>>)>;

/// Both stage graphs of a workspace, plus the edges no stage holds.
#[derive(Debug, Clone)]
pub struct DependencyGraph {
    build: StageGraph,
    run: StageGraph,
    external: Vec<Edge>,
    superseded: Vec<Edge>,
}

impl DependencyGraph {
    /// Builds both stage graphs and checks each for cycles separately.
    pub fn from_workspace(workspace: &Workspace) -> Result<DependencyGraph, GraphError> {
        let graph = Self::build_unchecked(workspace)?;
        graph.verify_acyclic()?;
        Ok(graph)
    }

    /// Builds both stage graphs and checks only `stages` for cycles: a command that works on
    /// the run stage must not be refused because of a cycle in the build stage.
    pub fn from_workspace_for(
        workspace: &Workspace,
        stages: &[Stage],
    ) -> Result<DependencyGraph, GraphError> {
        let graph = Self::build_unchecked(workspace)?;
        for &stage in stages {
            graph.stage(stage).verify_acyclic()?;
        }
        Ok(graph)
    }

    fn build_unchecked(workspace: &Workspace) -> Result<DependencyGraph, GraphError> {
        let nodes: Vec<String> = workspace.services.iter().map(|s| s.name.clone()).collect();
        let mut build = StageGraph::new(Stage::Build, nodes.clone());
        let mut run = StageGraph::new(Stage::Run, nodes);
        let mut external = Vec::new();
        let mut superseded = Vec::new();
        for service in &workspace.services {
            for dep in &service.dependencies {
                let edge = Edge {
                    consumer: service.name.clone(),
                    producer: dep.name.clone(),
                    kind: dep.kind,
                    endpoints: if dep.kind.consumes_endpoints() {
                        dep.endpoints.clone()
                    } else {
                        Vec::new()
                    },
                    origin: EdgeOrigin::Declared,
                };
                if dep.kind == DependencyKind::External {
                    external.push(edge);
                    continue;
                }
                for stage in dep.kind.stages() {
                    let graph = match stage {
                        Stage::Build => &mut build,
                        Stage::Run => &mut run,
                    };
                    graph.add_edge(edge.clone())?;
                }
            }
        }
        // Composition references bind the pair at run time whatever the declaration says.
        // They are added once every declared edge is in, so "would this close a cycle" is
        // judged against the whole declared graph.
        for service in &workspace.services {
            for (key, value) in &service.env {
                for (producer, endpoint) in value.references() {
                    if producer == service.name {
                        continue;
                    }
                    let existing = run
                        .edges
                        .iter_mut()
                        .chain(run.members.iter_mut())
                        .find(|e| e.consumer == service.name && e.producer == producer);
                    if let Some(existing) = existing {
                        if !existing.endpoints.is_empty()
                            && !existing.endpoints.iter().any(|e| e == endpoint)
                        {
                            existing.endpoints.push(endpoint.to_owned());
                        }
                        continue;
                    }
                    if let Some(declared) = external
                        .iter()
                        .find(|e| e.consumer == service.name && e.producer == producer)
                    {
                        tracing::info!(
                            consumer = %service.name,
                            producer,
                            env = %key,
                            "an ${{endpoint:...}} reference supersedes the external declaration: the producer runs first"
                        );
                        superseded.push(declared.clone());
                    }
                    let edge = Edge {
                        consumer: service.name.clone(),
                        producer: producer.to_owned(),
                        kind: DependencyKind::Runtime,
                        endpoints: vec![endpoint.to_owned()],
                        origin: EdgeOrigin::Reference { key: key.clone() },
                    };
                    if run.depends_on(producer, &service.name) {
                        tracing::info!(
                            consumer = %service.name,
                            producer,
                            env = %key,
                            "the reference would close a startup cycle: the producer joins the run without a startup wait"
                        );
                        run.add_member_edge(edge)?;
                    } else {
                        run.add_edge(edge)?;
                    }
                }
            }
        }
        Ok(DependencyGraph {
            build,
            run,
            external,
            superseded,
        })
    }

    /// Checks each stage separately: a cycle in the union of both is legitimate.
    pub fn verify_acyclic(&self) -> Result<(), GraphError> {
        self.build.verify_acyclic()?;
        self.run.verify_acyclic()
    }

    pub fn stage(&self, stage: Stage) -> &StageGraph {
        match stage {
            Stage::Build => &self.build,
            Stage::Run => &self.run,
        }
    }

    /// A stage's graph by name; an unknown name is an error.
    pub fn for_stage(&self, name: &str) -> Result<&StageGraph, GraphError> {
        Ok(self.stage(name.parse()?))
    }

    /// The ordered stages of a phase, each with its start layers.
    pub fn order_for(&self, phase: Phase) -> Result<PhaseOrder, GraphError> {
        phase
            .stages()
            .iter()
            .map(|&s| Ok((s, self.stage(s).layers()?)))
            .collect()
    }

    /// As [`order_for`](Self::order_for), by phase name; an unknown name is an error.
    pub fn order_for_name(&self, phase: &str) -> Result<PhaseOrder, GraphError> {
        self.order_for(phase.parse()?)
    }

    /// Each stage restricted to `target`'s closure in that stage.
    pub fn restrict_to(&self, target: &str) -> Result<DependencyGraph, GraphError> {
        Ok(DependencyGraph {
            build: self.build.restrict_to(&[target])?,
            run: self.run.restrict_to(&[target])?,
            external: self
                .external
                .iter()
                .filter(|e| e.consumer == target)
                .cloned()
                .collect(),
            superseded: self
                .superseded
                .iter()
                .filter(|e| e.consumer == target)
                .cloned()
                .collect(),
        })
    }

    /// Every edge that makes `consumer` need a producer at run time: the ordering run-stage
    /// edges and the membership-only ones.
    pub fn run_needs<'a>(&'a self, consumer: &'a str) -> impl Iterator<Item = &'a Edge> + 'a {
        self.run.prerequisites(consumer).chain(
            self.run
                .members
                .iter()
                .filter(move |e| e.consumer == consumer),
        )
    }

    /// Declared `external` edges (no stage holds them).
    pub fn external_edges(&self) -> &[Edge] {
        &self.external
    }

    /// External declarations an `${endpoint:...}` reference overrode with a runtime edge.
    pub fn superseded(&self) -> &[Edge] {
        &self.superseded
    }

    /// The user-facing notes about how `services` were put together: each superseded
    /// `external` declaration and each reference that joins its producer to the run without
    /// a startup wait, as (consumer, text).
    pub fn notices_for(&self, services: &[String]) -> Vec<(String, String)> {
        let mut notes = Vec::new();
        for e in &self.superseded {
            if services.contains(&e.consumer) {
                notes.push((
                    e.consumer.clone(),
                    format!(
                        "its `external` dependency on `{}` is superseded by an ${{endpoint:{}/...}} reference: `{}` runs first and is waited for (declare `kind: runtime` to say so)",
                        e.producer, e.producer, e.producer
                    ),
                ));
            }
        }
        for e in &self.run.members {
            if services.contains(&e.consumer) {
                let key = match &e.origin {
                    EdgeOrigin::Reference { key } => key.as_str(),
                    EdgeOrigin::Declared => "",
                };
                notes.push((
                    e.consumer.clone(),
                    format!(
                        "`{}` depends on it, so the reference to `{}` in `{key}` adds no startup wait; `{}` runs in this flow and its address is already allocated",
                        e.producer, e.producer, e.producer
                    ),
                ));
            }
        }
        notes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn edge(consumer: &str, producer: &str, kind: DependencyKind) -> Edge {
        Edge {
            consumer: consumer.into(),
            producer: producer.into(),
            kind,
            endpoints: vec![],
            origin: EdgeOrigin::Declared,
        }
    }

    fn graph(nodes: &[&str], edges: &[(&str, &str)]) -> StageGraph {
        let mut g = StageGraph::new(Stage::Run, nodes.iter().map(|s| s.to_string()).collect());
        for (c, p) in edges {
            g.add_edge(edge(c, p, DependencyKind::Runtime)).unwrap();
        }
        g
    }

    #[test]
    fn layers_put_independent_services_together_and_producers_first() {
        let g = graph(
            &["web", "api", "db", "cache"],
            &[("web", "api"), ("api", "db"), ("api", "cache")],
        );
        assert_eq!(
            g.layers().unwrap(),
            vec![
                vec!["db".to_string(), "cache".into()],
                vec!["api".into()],
                vec!["web".into()]
            ]
        );
    }

    #[test]
    fn running_dependents_follow_health_edges_transitively_but_not_completion_edges() {
        let mut g = graph(
            &["web", "api", "db", "cache", "migrate", "report"],
            &[("web", "api"), ("api", "db"), ("api", "cache")],
        );
        g.add_edge(edge("api", "migrate", DependencyKind::Completion))
            .unwrap();
        g.add_edge(edge("report", "migrate", DependencyKind::Completion))
            .unwrap();
        assert_eq!(g.running_dependents(&["db"]), vec!["web", "api"]);
        assert_eq!(g.running_dependents(&["api", "web"]), Vec::<String>::new());
        assert_eq!(
            g.running_dependents(&["migrate"]),
            Vec::<String>::new(),
            "a job that completed is needed by nobody any more"
        );
    }

    #[test]
    fn a_cycle_names_the_stage_and_the_path() {
        let g = graph(&["x", "a", "b"], &[("a", "b"), ("b", "a")]);
        let err = g.verify_acyclic().unwrap_err();
        assert_eq!(
            err.to_string(),
            "run dependencies have a cycle: a -> b -> a"
        );
    }

    #[test]
    fn a_shared_dependency_is_torn_down_once_after_all_its_consumers() {
        let g = graph(
            &["db", "api", "worker", "web"],
            &[("api", "db"), ("worker", "db"), ("web", "api")],
        );
        let all: Vec<String> = ["db", "api", "worker", "web"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(
            g.teardown_layers(&all),
            vec![
                vec!["worker".to_string(), "web".into()],
                vec!["api".into()],
                vec!["db".into()]
            ]
        );
    }

    #[test]
    fn teardown_layers_only_consider_participants() {
        let g = graph(&["db", "api", "web"], &[("api", "db"), ("web", "api")]);
        let some = vec!["db".to_string(), "web".to_string()];
        assert_eq!(
            g.teardown_layers(&some),
            vec![vec!["db".to_string(), "web".into()]]
        );
    }
}
