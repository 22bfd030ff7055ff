//! Changes to a running flow, applied by its supervisor: restart services in place (same
//! environment, same ports; dependents keep running), add services with whatever of their
//! run-time closure does not run yet, and withdraw services (refusing while running services
//! depend on them, or stopping those dependents first). Each stop is a layered teardown of
//! the affected services alone, with receipts; each start goes through the start policy and
//! readiness like any other, and the change is answered once it is ready.
//!
//! This submodule owns how a change is applied and answered. It must never plan (the
//! [`Planner`] does Load for services that join) and never stop a service the change does
//! not name, except the dependents a `--with-dependents` stop was asked to take along.

use std::sync::Arc;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::{FlowEndReason, OwnedGroup, Phase, Slot, SlotSpec, Supervisor};
use crate::change::{ChangeReport, ChangeRequest, StartedService};
use crate::error::{FlowError, GraphError};
use crate::events::FlowEvent;
use crate::graph::StageGraph;
use crate::policy::Standing;
use crate::ports::PortMap;
use crate::teardown::{self, StopTarget, TeardownBudget, TeardownOperation, TeardownReport};

type Reply = oneshot::Sender<Result<ChangeReport, FlowError>>;

/// Load for services joining a running flow. The engine implements it; the supervisor only
/// calls it, so planning stays where it is done for `up`.
pub(crate) trait Planner: Send {
    /// Whether `service` is a service of the workspace.
    fn knows(&self, service: &str) -> bool;
    /// `targets` and everything they need at run time, in declaration order.
    fn closure(&self, targets: &[String]) -> Result<Vec<String>, FlowError>;
    /// Load for `joining` (services the flow has no slot for): their ports (kept beside
    /// `ports`, which the flow holds), log files and environments, and the flow's graph with
    /// them in it.
    fn extend(
        &self,
        current: &StageGraph,
        ports: &PortMap,
        joining: &[String],
    ) -> Result<Extension, FlowError>;
}

/// What Load gives services joining a running flow.
pub(crate) struct Extension {
    /// The run graph of everything in the flow now, the joining services included.
    pub graph: StageGraph,
    /// Every address of the flow, the joining services' included.
    pub ports: PortMap,
    pub slots: Vec<SlotSpec>,
    /// (service, text): ports that had to move, worth a warning.
    pub warnings: Vec<(String, String)>,
}

/// A change waiting for the services it started to be ready.
pub(super) struct Awaiting {
    services: Vec<String>,
    report: ChangeReport,
    began: Instant,
    reply: Reply,
}

fn elapsed_ms(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX)
}

impl Supervisor {
    /// Applies `request` and answers it now (a refusal, a stop) or once what it started is
    /// ready (see [`answer_awaiting`](Self::answer_awaiting)).
    pub(super) async fn change(&mut self, request: ChangeRequest, reply: Reply) {
        let began = Instant::now();
        if self.ready.is_some() {
            let _ = reply.send(Err(FlowError::StillStarting));
            return;
        }
        let mut report = ChangeReport {
            operation: request.operation().to_owned(),
            supervisor_pid: self.supervisor.pid,
            stopped: TeardownReport::default(),
            started: Vec::new(),
            unchanged: Vec::new(),
            elapsed_ms: 0,
        };
        let asked = match &request {
            ChangeRequest::Restart { .. } => "restart",
            ChangeRequest::Add { .. } => "up",
            ChangeRequest::Stop {
                with_dependents: true,
                ..
            } => "stop --with-dependents",
            ChangeRequest::Stop { .. } => "stop",
        };
        self.events.emit(FlowEvent::Notice {
            service: request.services().join(", "),
            text: format!(
                "asked from another shell: `hostd flow {asked} {}`",
                request.services().join(" ")
            ),
        });
        let outcome = match &request {
            ChangeRequest::Restart { services } => self.restart(services, &mut report).await,
            ChangeRequest::Add { services } => self.add(services, &mut report),
            ChangeRequest::Stop {
                services,
                with_dependents,
            } => self.withdraw(services, *with_dependents, &mut report).await,
        };
        match outcome {
            Err(e) => {
                let _ = reply.send(Err(e));
            }
            Ok(awaited) if awaited.is_empty() => {
                report.elapsed_ms = elapsed_ms(began);
                let _ = reply.send(Ok(report));
            }
            Ok(services) => self.awaiting.push(Awaiting {
                services,
                report,
                began,
                reply,
            }),
        }
    }

    /// Answers every change whose services are all ready (or completed), and refuses one
    /// whose service can no longer get there. A change waiting when the flow fails is
    /// answered by [`abandon_awaiting`](Self::abandon_awaiting) instead.
    pub(super) fn answer_awaiting(&mut self) {
        if self.awaiting.is_empty() || self.fatal.is_some() {
            return;
        }
        let standings = self.standings();
        for mut waiting in std::mem::take(&mut self.awaiting) {
            let mut ready = true;
            let mut failed = None;
            for service in &waiting.services {
                match standings.get(service) {
                    Some(Standing::Healthy | Standing::Completed) => {}
                    Some(Standing::Failed(why)) => {
                        failed = Some((service.clone(), why.clone()));
                        break;
                    }
                    _ => ready = false,
                }
            }
            if let Some((service, reason)) = failed {
                let _ = waiting
                    .reply
                    .send(Err(FlowError::NotStarted { service, reason }));
            } else if ready {
                waiting.report.started = waiting
                    .services
                    .iter()
                    .filter_map(|s| self.index.get(s))
                    .map(|&i| started(&self.slots[i]))
                    .collect();
                waiting.report.elapsed_ms = elapsed_ms(waiting.began);
                let _ = waiting.reply.send(Ok(waiting.report));
            } else {
                self.awaiting.push(waiting);
            }
        }
    }

    /// The flow ends while changes wait: each is told why.
    pub(super) fn abandon_awaiting(&mut self, reason: &FlowEndReason) {
        for waiting in std::mem::take(&mut self.awaiting) {
            let why = match reason {
                FlowEndReason::Failed(e) => format!(
                    "the flow failed before it was ready ({}: {e}) and was torn down",
                    e.code()
                ),
                FlowEndReason::Cancelled | FlowEndReason::Shutdown => {
                    "the flow was torn down before it was ready".to_owned()
                }
            };
            let _ = waiting.reply.send(Err(FlowError::NotStarted {
                service: waiting.services.join(", "),
                reason: why,
            }));
        }
    }

    /// The slots `services` name, each once, refusing a name the flow does not run.
    fn named_slots(&self, services: &[String], operation: &str) -> Result<Vec<usize>, FlowError> {
        let mut named = Vec::new();
        for name in services {
            let Some(&i) = self.index.get(name) else {
                if !self.planner.knows(name) {
                    return Err(GraphError::UnknownService(name.clone()).into());
                }
                return Err(FlowError::NotInFlow {
                    service: name.clone(),
                    hint: format!(
                        "it is not part of it; `hostd flow up {name}` adds it (before `{operation}`)"
                    ),
                });
            };
            match self.slots[i].phase {
                Phase::Stopped => {
                    return Err(FlowError::NotInFlow {
                        service: name.clone(),
                        hint: format!("it was stopped; `hostd flow up {name}` starts it again"),
                    });
                }
                Phase::Pending => {
                    return Err(FlowError::NotInFlow {
                        service: name.clone(),
                        hint: "it has not been started yet (it waits for what it needs)".into(),
                    });
                }
                _ => {}
            }
            if !named.contains(&i) {
                named.push(i);
            }
        }
        Ok(named)
    }

    /// Restart: stop the named services (consumers first among them) and start them again
    /// through the start policy, with their environments and ports unchanged.
    async fn restart(
        &mut self,
        services: &[String],
        report: &mut ChangeReport,
    ) -> Result<Vec<String>, FlowError> {
        let named = self.named_slots(services, "restart")?;
        report.stopped = self.stop_slots(&named, TeardownOperation::Restart).await;
        let mut again = Vec::new();
        let mut stuck = None;
        for &i in &named {
            let slot = &mut self.slots[i];
            if slot.process.is_some() {
                stuck = Some((
                    slot.spec.name.clone(),
                    slot.detail.clone().unwrap_or_default(),
                ));
                continue;
            }
            slot.phase = Phase::Pending;
            slot.detail = Some("restarting (`hostd flow restart`)".into());
            again.push(slot.spec.name.clone());
        }
        match stuck {
            Some((service, detail)) => Err(FlowError::StopFailed { service, detail }),
            None => Ok(again),
        }
    }

    /// Add: start what the named services need and do not have, and them.
    fn add(
        &mut self,
        services: &[String],
        report: &mut ChangeReport,
    ) -> Result<Vec<String>, FlowError> {
        for name in services {
            if !self.planner.knows(name) {
                return Err(GraphError::UnknownService(name.clone()).into());
            }
        }
        let closure = self.planner.closure(services)?;
        let mut joining = Vec::new();
        let mut again = Vec::new();
        for name in &closure {
            match self.index.get(name) {
                None => joining.push(name.clone()),
                Some(&i) if matches!(self.slots[i].phase, Phase::Stopped | Phase::Exited(_)) => {
                    again.push(i)
                }
                Some(_) => {}
            }
        }
        for name in services {
            let running = self.index.get(name).is_some_and(|i| !again.contains(i));
            if running && !report.unchanged.contains(name) {
                report.unchanged.push(name.clone());
            }
        }
        if !joining.is_empty() {
            let extension = self.planner.extend(&self.graph, &self.ports, &joining)?;
            for (service, text) in extension.warnings {
                self.events.emit(FlowEvent::Warning { service, text });
            }
            self.graph = extension.graph;
            self.ports = extension.ports;
            for spec in extension.slots {
                self.index.insert(spec.name.clone(), self.slots.len());
                self.slots.push(Slot::new(spec));
            }
            if self
                .excluded
                .as_ref()
                .is_some_and(|x| joining.contains(&x.name))
            {
                self.excluded = None;
            }
        }
        for &i in &again {
            let slot = &mut self.slots[i];
            if let Some(p) = slot.process.take() {
                p.reap_if_exited();
            }
            slot.phase = Phase::Pending;
            slot.detail = None;
        }
        let mut awaited: Vec<String> = joining;
        awaited.extend(again.iter().map(|&i| self.slots[i].spec.name.clone()));
        Ok(closure
            .into_iter()
            .filter(|n| awaited.contains(n))
            .collect())
    }

    /// Stop (withdraw): the named services leave the flow, and with `with_dependents` so do
    /// the running services that need them, consumers first.
    async fn withdraw(
        &mut self,
        services: &[String],
        with_dependents: bool,
        report: &mut ChangeReport,
    ) -> Result<Vec<String>, FlowError> {
        let mut named = Vec::new();
        for name in services {
            match self.index.get(name) {
                Some(&i) if self.slots[i].phase == Phase::Stopped => {
                    if !report.unchanged.contains(name) {
                        report.unchanged.push(name.clone());
                    }
                }
                Some(&i) => {
                    if !named.contains(&i) {
                        named.push(i);
                    }
                }
                None => {
                    // Refused exactly as a restart of it would be.
                    self.named_slots(std::slice::from_ref(name), "stop")?;
                }
            }
        }
        let names: Vec<&str> = named
            .iter()
            .map(|&i| self.slots[i].spec.name.as_str())
            .collect();
        let dependents: Vec<usize> = self
            .graph
            .running_dependents(&names)
            .iter()
            .filter_map(|d| self.index.get(d).copied())
            .filter(|&i| self.slots[i].is_live())
            .collect();
        if !dependents.is_empty() && !with_dependents {
            return Err(FlowError::HasDependents {
                services: names.iter().map(|s| (*s).to_owned()).collect(),
                dependents: dependents
                    .iter()
                    .map(|&i| self.slots[i].spec.name.clone())
                    .collect(),
            });
        }
        let mut all = named;
        all.extend(dependents);
        report.stopped = self.stop_slots(&all, TeardownOperation::Withdraw).await;
        for &i in &all {
            let slot = &mut self.slots[i];
            if slot.phase == Phase::Stopped {
                let how = slot.detail.take().unwrap_or_default();
                slot.detail = Some(format!("stopped by `hostd flow stop` ({how})"));
            }
        }
        Ok(Vec::new())
    }

    /// Stops the slots `indices` as a teardown of their own (consumers first among them,
    /// within the flow's budget), with a receipt each. A slot whose group is proven gone is
    /// left `stopped` without a process; one that lingers keeps its process recorded
    /// (`stopping`) so `down` and `recover` still find it.
    async fn stop_slots(
        &mut self,
        indices: &[usize],
        operation: TeardownOperation,
    ) -> TeardownReport {
        for &i in indices {
            let slot = &mut self.slots[i];
            for task in slot.tasks.drain(..) {
                task.abort();
            }
            slot.phase = Phase::Stopping;
        }
        self.persist();
        let participants: Vec<String> = indices
            .iter()
            .filter(|&&i| self.slots[i].process.is_some())
            .map(|&i| self.slots[i].spec.name.clone())
            .collect();
        let layers = self.graph.teardown_layers(&participants);
        let targets = self.owned_groups(&layers);
        let budget = TeardownBudget {
            per_layer: self.options.teardown_layer_budget,
            kill_grace: self.options.kill_grace,
        };
        let events = self.events.clone();
        let report = teardown::teardown(operation, targets, budget, |receipt| {
            events.emit(FlowEvent::Stopped(receipt.clone()));
        })
        .await;
        for &i in indices {
            let slot = &mut self.slots[i];
            let receipt = report.receipt(&slot.spec.name);
            let lingering = receipt.is_some_and(|r| r.lingering);
            match slot.process.take() {
                Some(p) if lingering || p.group_alive() => {
                    slot.process = Some(p);
                    slot.phase = Phase::Stopping;
                }
                Some(p) => {
                    p.reap_if_exited();
                    slot.phase = Phase::Stopped;
                }
                None => slot.phase = Phase::Stopped,
            }
            slot.detail = Some(match receipt {
                Some(r) => format!("{}: {}", r.outcome, r.detail),
                None => "had no process".into(),
            });
        }
        self.persist();
        report
    }

    /// The process groups of `layers`' services, as teardown targets in the same layers.
    pub(super) fn owned_groups(&self, layers: &[Vec<String>]) -> Vec<Vec<Arc<dyn StopTarget>>> {
        layers
            .iter()
            .map(|layer| {
                layer
                    .iter()
                    .filter_map(|name| self.index.get(name))
                    .filter_map(|&i| {
                        let slot = &self.slots[i];
                        slot.process.as_ref().map(|p| {
                            Arc::new(OwnedGroup {
                                name: slot.spec.name.clone(),
                                process: p.clone(),
                            }) as Arc<dyn StopTarget>
                        })
                    })
                    .collect()
            })
            .collect()
    }
}

impl Slot {
    /// Whether the service is in the flow and running, or on its way there.
    fn is_live(&self) -> bool {
        matches!(
            self.phase,
            Phase::Pending | Phase::Starting | Phase::Running | Phase::Restarting | Phase::Stopping
        )
    }
}

fn started(slot: &Slot) -> StartedService {
    let status = slot.status();
    StartedService {
        name: status.name,
        state: status.state,
        pid: status.pid,
        endpoints: status
            .endpoints
            .iter()
            .map(|(n, a)| (n.clone(), a.to_string()))
            .collect(),
    }
}
