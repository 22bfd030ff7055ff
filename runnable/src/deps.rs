//! A runnable's dependencies on flow services: the report `show` prints (each endpoint
//! resolved or not, with the reason), and the environment `invoke` injects.
//!
//! Endpoints are matched by **name** only, against the flow declared by the workspace's
//! `flow.yaml`. Addresses use the flows' own naming (`FLOW_DEP_<SERVICE>_<ENDPOINT>_ADDR`)
//! and the flows' own resolution: the live allocation recorded by a running `hostd flow up`
//! when the flow is up; otherwise a fixed port's loopback address; a port the flow allocates
//! only when it starts refuses the invocation, naming `hostd flow up`.
//!
//! The report never fails and never probes: no connection is made, nothing is started, no
//! flow state is written. This module must never start or stop a flow.

use std::path::Path;

use crate::declaration::{Declaration, DependencyDecl};
use crate::error::RunnableError;
use flow;

/// One declared endpoint and whether it resolves.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct EndpointReport {
    pub service: String,
    pub endpoint: String,
    /// The variable the address is injected as.
    pub env: String,
    pub resolved: bool,
    /// Why it does not resolve.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

enum FlowView {
    Missing,
    Broken(String),
    Loaded(flow::Workspace),
}

fn view(flow_root: Option<&Path>) -> FlowView {
    let Some(root) = flow_root else {
        return FlowView::Missing;
    };
    if !root.join("flow.yaml").exists() {
        return FlowView::Missing;
    }
    match flow::Workspace::load(root) {
        Ok(w) => FlowView::Loaded(w),
        Err(e) => FlowView::Broken(format!("flow.yaml does not load [{}]: {e}", e.code())),
    }
}

/// Resolves one endpoint by name; `Err` is the reason it does not.
fn find<'a>(
    flow: &'a FlowView,
    service: &str,
    endpoint: &str,
) -> Result<&'a flow::Endpoint, String> {
    match flow {
        FlowView::Missing => Err("the workspace has no flow.yaml declaring services".into()),
        FlowView::Broken(why) => Err(why.clone()),
        FlowView::Loaded(w) => {
            let Some(s) = w.services.iter().find(|s| s.name == service) else {
                return Err(format!("no service `{service}` in flow `{}`", w.name));
            };
            s.endpoint(endpoint).ok_or_else(|| {
                let names: Vec<&str> = s.endpoints.iter().map(|e| e.name.as_str()).collect();
                format!(
                    "service `{service}` has no endpoint named `{endpoint}` (it has: {})",
                    if names.is_empty() {
                        "none".to_owned()
                    } else {
                        names.join(", ")
                    }
                )
            })
        }
    }
}

/// The dependency report of `decl` against the flow at `flow_root`.
pub fn report(decl: &Declaration, flow_root: Option<&Path>) -> Vec<EndpointReport> {
    if decl.dependencies.is_empty() {
        return Vec::new();
    }
    let flow = view(flow_root);
    let mut out = Vec::new();
    for dep in &decl.dependencies {
        for endpoint in &dep.endpoints {
            let found = find(&flow, &dep.service, endpoint);
            out.push(EndpointReport {
                service: dep.service.clone(),
                endpoint: endpoint.clone(),
                env: DependencyDecl::env_var(&dep.service, endpoint),
                resolved: found.is_ok(),
                reason: found.err(),
            });
        }
    }
    out
}

/// The environment an invocation of `decl` gets for its dependencies, or the refusal naming
/// the first dependency that has no address now.
pub fn environment(
    decl: &Declaration,
    flow_root: Option<&Path>,
) -> Result<Vec<(String, String)>, RunnableError> {
    if decl.dependencies.is_empty() {
        return Ok(Vec::new());
    }
    let flow = view(flow_root);
    let live = flow_root.and_then(|root| flow::status::recorded(root).ok().flatten());
    let mut env = Vec::new();
    for dep in &decl.dependencies {
        for endpoint in &dep.endpoints {
            let refuse = |reason: String| RunnableError::Dependency {
                identity: decl.identity.to_string(),
                dependency: format!("{}/{endpoint}", dep.service),
                reason,
            };
            let declared = find(&flow, &dep.service, endpoint).map_err(refuse)?;
            let running = live.as_ref().filter(|s| s.supervisor_alive).and_then(|s| {
                s.services
                    .iter()
                    .find(|r| r.name == dep.service && r.state == "running")
                    .and_then(|r| r.endpoints.iter().find(|(n, _)| n == endpoint))
                    .map(|(_, addr)| addr.clone())
            });
            let address = match (running, declared.port) {
                (Some(addr), _) => addr,
                (None, Some(port)) => format!("{}:{port}", flow::ports::LOOPBACK),
                (None, None) => {
                    return Err(refuse(format!(
                        "service `{}` is not running and its endpoint `{endpoint}` gets a port only when the flow starts; run `hostd flow up` first",
                        dep.service
                    )));
                }
            };
            env.push((DependencyDecl::env_var(&dep.service, endpoint), address));
        }
    }
    Ok(env)
}
