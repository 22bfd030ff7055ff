//! Loopback addresses for the endpoints of a flow: fixed ports are checked free, the others
//! are allocated by the kernel on 127.0.0.1.
//!
//! This module owns allocation only. It must never hand out the same port twice in one flow
//! and must never bind anything beyond the moment of allocation (the services bind).

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};

use crate::flow::error::FlowError;
use crate::flow::manifest::Workspace;

/// The host every flow address uses.
pub const LOOPBACK: Ipv4Addr = Ipv4Addr::LOCALHOST;

/// The port of every endpoint of the selected services.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PortMap {
    ports: BTreeMap<(String, String), u16>,
}

impl PortMap {
    pub fn port(&self, service: &str, endpoint: &str) -> Option<u16> {
        self.ports
            .get(&(service.to_owned(), endpoint.to_owned()))
            .copied()
    }

    pub fn addr(&self, service: &str, endpoint: &str) -> Option<SocketAddr> {
        self.port(service, endpoint)
            .map(|p| SocketAddr::from((LOOPBACK, p)))
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &str, u16)> {
        self.ports
            .iter()
            .map(|((s, e), p)| (s.as_str(), e.as_str(), *p))
    }
}

/// Allocates every endpoint of `services`. All kernel-chosen ports are held open until the
/// last one is chosen, so no two endpoints of the flow get the same port.
pub fn allocate(workspace: &Workspace, services: &[String]) -> Result<PortMap, FlowError> {
    let mut map = PortMap::default();
    let selected = || services.iter().filter_map(|n| workspace.service(n));
    // Fixed ports first, so a kernel-chosen port can never shadow one of them.
    for service in selected() {
        for endpoint in &service.endpoints {
            if let Some(port) = endpoint.port {
                let probe = TcpListener::bind((LOOPBACK, port)).map_err(|e| {
                    FlowError::PortUnavailable {
                        service: service.name.clone(),
                        endpoint: endpoint.name.clone(),
                        port,
                        reason: e.to_string(),
                    }
                })?;
                drop(probe);
                map.ports
                    .insert((service.name.clone(), endpoint.name.clone()), port);
            }
        }
    }
    let fixed: Vec<u16> = map.ports.values().copied().collect();
    let mut held: Vec<TcpListener> = Vec::new();
    for service in selected() {
        for endpoint in service.endpoints.iter().filter(|e| e.port.is_none()) {
            let failure = |reason: String| FlowError::PortAllocation {
                service: service.name.clone(),
                endpoint: endpoint.name.clone(),
                reason,
            };
            let port = loop {
                let listener =
                    TcpListener::bind((LOOPBACK, 0)).map_err(|e| failure(e.to_string()))?;
                let port = listener
                    .local_addr()
                    .map_err(|e| failure(e.to_string()))?
                    .port();
                held.push(listener);
                if !fixed.contains(&port) {
                    break port;
                }
                if held.len() > 1024 {
                    return Err(failure("the kernel keeps offering fixed ports".into()));
                }
            };
            map.ports
                .insert((service.name.clone(), endpoint.name.clone()), port);
        }
    }
    drop(held);
    Ok(map)
}
