//! Loopback addresses for the endpoints of a flow: fixed ports are checked free, the others
//! are allocated by the kernel on 127.0.0.1; and the check, repeated before every start, that
//! nobody else took a port meanwhile (on 127.0.0.1 and on ::1), naming who did.
//!
//! This module owns allocation and the free-port check only. It must never hand out the same
//! port twice in one flow and must never bind anything beyond the moment of a check (the
//! services bind).

use std::collections::BTreeMap;
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener};

use crate::error::FlowError;
use crate::manifest::Workspace;
use crate::sockets;

/// Whether `port` can be bound on both loopback families right now. A squatter on either one
/// would answer a client that resolves `localhost` to it, so both are checked; a machine
/// without IPv6 only checks 127.0.0.1. The error names the holder when `/proc` can tell.
pub fn check_free(port: u16) -> Result<(), String> {
    let v4 = TcpListener::bind((LOOPBACK, port));
    let v6 = TcpListener::bind((Ipv6Addr::LOCALHOST, port));
    let problem = match (&v4, &v6) {
        (Err(e), _) => Some(format!("127.0.0.1:{port}: {e}")),
        (Ok(_), Err(e)) if !ipv6_missing(e) => Some(format!("[::1]:{port}: {e}")),
        _ => None,
    };
    drop(v4);
    drop(v6);
    match problem {
        None => Ok(()),
        Some(reason) => Err(match sockets::describe_port_holders(port) {
            Some(holders) => format!("{reason}; listening: {holders}"),
            None => reason,
        }),
    }
}

/// An IPv6 bind failure that means "this machine has no IPv6 loopback", not "taken".
fn ipv6_missing(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(nix::libc::EADDRNOTAVAIL) | Some(nix::libc::EAFNOSUPPORT)
    )
}

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

    pub fn insert(&mut self, service: &str, endpoint: &str, port: u16) {
        self.ports
            .insert((service.to_owned(), endpoint.to_owned()), port);
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &str, u16)> {
        self.ports
            .iter()
            .map(|((s, e), p)| (s.as_str(), e.as_str(), *p))
    }
}

/// The fixed ports of `services`, unchecked: addresses of producers a stand-alone run does
/// not start, which are expected to be served from elsewhere.
pub fn fixed(workspace: &Workspace, services: &[String]) -> PortMap {
    let mut map = PortMap::default();
    for service in services.iter().filter_map(|n| workspace.service(n)) {
        for endpoint in &service.endpoints {
            if let Some(port) = endpoint.port {
                map.insert(&service.name, &endpoint.name, port);
            }
        }
    }
    map
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
                check_free(port).map_err(|reason| FlowError::PortUnavailable {
                    service: service.name.clone(),
                    endpoint: endpoint.name.clone(),
                    port,
                    reason,
                })?;
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
                // The kernel chose a port free on 127.0.0.1; it must be free on ::1 too.
                let v6 = TcpListener::bind((Ipv6Addr::LOCALHOST, port));
                let v6_free = match &v6 {
                    Ok(_) => true,
                    Err(e) => ipv6_missing(e),
                };
                drop(v6);
                if !fixed.contains(&port) && v6_free {
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
