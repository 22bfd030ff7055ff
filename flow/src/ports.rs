//! Loopback addresses for the endpoints of a flow: fixed ports are checked free; every other
//! endpoint keeps one port from one `up` to the next — the port recorded for it in the
//! workspace's state folder, or, the first time, one derived from the workspace's path and the
//! endpoint's name — moving (and saying so) only when someone else holds it; and the check,
//! repeated before every start, that nobody else took a port meanwhile (on 127.0.0.1 and on
//! ::1), naming who did.
//!
//! This module owns allocation, the record of chosen ports and the free-port check. It must
//! never hand out the same port twice in one flow and must never bind anything beyond the
//! moment of a check (the services bind).

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener};
use std::path::Path;

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

/// The first port a chosen (not fixed) port is derived in, and how many follow it. The range
/// ends below Linux's ephemeral range (32768 and up), so outgoing connections never hold one.
const DERIVED_BASE: u16 = 20000;
const DERIVED_SPAN: u16 = 12000;

/// The ports chosen for the workspace's endpoints by earlier runs, `service/endpoint → port`:
/// `.hostd/flow/ports.json`. Read leniently (a missing or unreadable record only means the
/// ports are derived again); written after each allocation that changed it.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PortRecord {
    pub version: u32,
    pub ports: BTreeMap<String, u16>,
}

impl PortRecord {
    const VERSION: u32 = 1;

    fn key(service: &str, endpoint: &str) -> String {
        format!("{service}/{endpoint}")
    }

    /// The record at `path`, or an empty one when there is none or it cannot be read.
    pub fn read(path: &Path) -> PortRecord {
        std::fs::read(path)
            .ok()
            .and_then(|bytes| serde_json::from_slice::<PortRecord>(&bytes).ok())
            .filter(|r| r.version == Self::VERSION)
            .unwrap_or_default()
    }

    /// Writes the record at `path` (through a temporary file and a rename).
    pub fn write(&self, path: &Path) -> io::Result<()> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let record = PortRecord {
            version: Self::VERSION,
            ports: self.ports.clone(),
        };
        let bytes = serde_json::to_vec_pretty(&record).map_err(io::Error::other)?;
        crate::state::write_atomic(path, &bytes)
    }
}

/// A chosen port that could not be kept: someone else held it, so the endpoint moved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortMove {
    pub service: String,
    pub endpoint: String,
    pub from: u16,
    pub to: u16,
    /// Why `from` could not be used (who holds it, when `/proc` can tell).
    pub reason: String,
}

impl PortMove {
    /// The line a user reads: which endpoint moved, from where to where, and why.
    pub fn describe(&self) -> String {
        format!(
            "{}/{} keeps port {} from earlier runs, but it is not free ({}); this run uses {} and keeps it from now on",
            self.service, self.endpoint, self.from, self.reason, self.to
        )
    }
}

/// What [`allocate`] chose: every endpoint's port, the record to keep for the next run, and
/// the endpoints that had to move off their recorded port.
#[derive(Debug, Clone, Default)]
pub struct Allocation {
    pub ports: PortMap,
    pub record: PortRecord,
    pub moves: Vec<PortMove>,
}

/// The port first tried for an endpoint never allocated before: a hash (FNV-1a, so it is the
/// same on every build) of the workspace's path and the endpoint's name, in the derived range.
pub fn derived_port(root: &Path, service: &str, endpoint: &str) -> u16 {
    let root = std::fs::canonicalize(root).unwrap_or_else(|_| root.to_path_buf());
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let text = format!("{}\0{service}\0{endpoint}", root.display());
    for byte in text.as_bytes() {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    DERIVED_BASE + (hash % u64::from(DERIVED_SPAN)) as u16
}

/// Allocates every endpoint of `services`: fixed ports checked free (a fixed port always wins,
/// even over a port recorded for another endpoint); every other endpoint gets its recorded
/// port, else its derived one, when that is free on both loopbacks and not taken in this flow;
/// otherwise the next free port of the derived range after it, and as a last resort one the
/// kernel chooses. `record` is what earlier runs chose.
pub fn allocate(
    workspace: &Workspace,
    services: &[String],
    record: &PortRecord,
) -> Result<Allocation, FlowError> {
    allocate_beside(workspace, services, record, &BTreeSet::new())
}

/// [`allocate`] for services joining a running flow: `held` are the ports the flow already
/// gave its other endpoints (bound or not yet), which no joining endpoint may get.
pub fn allocate_beside(
    workspace: &Workspace,
    services: &[String],
    record: &PortRecord,
    held: &BTreeSet<u16>,
) -> Result<Allocation, FlowError> {
    let mut map = PortMap::default();
    let selected = || services.iter().filter_map(|n| workspace.service(n));
    // Fixed ports first, so a chosen port can never shadow one of them.
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
    let mut taken: BTreeSet<u16> = map.ports.values().chain(held).copied().collect();
    let mut next_record = record.clone();
    let mut moves = Vec::new();
    for service in selected() {
        for endpoint in service.endpoints.iter().filter(|e| e.port.is_none()) {
            let key = PortRecord::key(&service.name, &endpoint.name);
            let recorded = record.ports.get(&key).copied();
            let wanted = recorded
                .unwrap_or_else(|| derived_port(&workspace.root, &service.name, &endpoint.name));
            let first = if taken.contains(&wanted) {
                Err(format!("another endpoint of this flow has port {wanted}"))
            } else {
                check_free(wanted)
            };
            let port = match first {
                Ok(()) => wanted,
                Err(reason) => {
                    let port = next_free(wanted, &taken).map_or_else(
                        || {
                            kernel_port(&taken).map_err(|reason| FlowError::PortAllocation {
                                service: service.name.clone(),
                                endpoint: endpoint.name.clone(),
                                reason,
                            })
                        },
                        Ok,
                    )?;
                    if recorded.is_some() {
                        moves.push(PortMove {
                            service: service.name.clone(),
                            endpoint: endpoint.name.clone(),
                            from: wanted,
                            to: port,
                            reason,
                        });
                    }
                    port
                }
            };
            taken.insert(port);
            next_record.ports.insert(key, port);
            map.ports
                .insert((service.name.clone(), endpoint.name.clone()), port);
        }
    }
    Ok(Allocation {
        ports: map,
        record: next_record,
        moves,
    })
}

/// The first port after `from` in the derived range (wrapping) that is free on both loopbacks
/// and not in `taken`; `None` after a bounded search.
fn next_free(from: u16, taken: &BTreeSet<u16>) -> Option<u16> {
    let offset = from.saturating_sub(DERIVED_BASE) % DERIVED_SPAN;
    (1..=256u16)
        .map(|step| DERIVED_BASE + (offset + step) % DERIVED_SPAN)
        .find(|port| !taken.contains(port) && check_free(*port).is_ok())
}

/// A port the kernel chooses on 127.0.0.1 that is also free on ::1 and not in `taken`.
fn kernel_port(taken: &BTreeSet<u16>) -> Result<u16, String> {
    let mut held: Vec<TcpListener> = Vec::new();
    loop {
        let listener = TcpListener::bind((LOOPBACK, 0)).map_err(|e| e.to_string())?;
        let port = listener.local_addr().map_err(|e| e.to_string())?.port();
        held.push(listener);
        let v6 = TcpListener::bind((Ipv6Addr::LOCALHOST, port));
        let v6_free = match &v6 {
            Ok(_) => true,
            Err(e) => ipv6_missing(e),
        };
        drop(v6);
        if !taken.contains(&port) && v6_free {
            return Ok(port);
        }
        if held.len() > 1024 {
            return Err("the kernel keeps offering ports this flow holds".into());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_derived_port_is_the_same_every_time_and_inside_its_range() {
        let root = Path::new("/nonexistent/shop");
        let a = derived_port(root, "api", "http");
        assert_eq!(a, derived_port(root, "api", "http"));
        assert!((DERIVED_BASE..DERIVED_BASE + DERIVED_SPAN).contains(&a));
        assert_ne!(a, derived_port(root, "api", "grpc"), "names must matter");
        assert_ne!(
            a,
            derived_port(Path::new("/nonexistent/other"), "api", "http"),
            "the workspace must matter"
        );
    }

    #[test]
    fn the_search_after_a_taken_port_wraps_inside_the_range_and_skips_the_flows_own() {
        let last = DERIVED_BASE + DERIVED_SPAN - 1;
        let taken: BTreeSet<u16> = [DERIVED_BASE].into();
        let next = next_free(last, &taken).expect("a free port");
        assert!((DERIVED_BASE + 1..DERIVED_BASE + DERIVED_SPAN).contains(&next));
    }
}
