//! Reading process facts from Linux `/proc`: a process's start identity (pid, process group,
//! start time since boot, boot id) and the live members of a process group.
//!
//! This module owns *reading* only, which is what ownership proofs are built from. It must
//! never send a signal or decide that something may be signalled.

use std::fs;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// Who a process is, beyond its pid: a pid can be reused, a pid with the same start time on
/// the same boot cannot.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StartIdentity {
    pub pid: i32,
    pub pgid: i32,
    /// Field 22 of `/proc/<pid>/stat`: clock ticks since boot when the process started.
    pub start_time: u64,
    /// `/proc/sys/kernel/random/boot_id` when the identity was taken.
    pub boot_id: String,
}

/// The fields of `/proc/<pid>/stat` this crate uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    pub pid: i32,
    pub state: char,
    pub pgrp: i32,
    pub start_time: u64,
}

impl ProcStat {
    pub fn is_zombie(&self) -> bool {
        matches!(self.state, 'Z' | 'X' | 'x')
    }
}

fn parse_stat(text: &str) -> Option<ProcStat> {
    // The command name sits in parentheses and may itself contain spaces or parentheses, so
    // the fields are counted from the last `)`.
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let pid = text[..open].trim().parse().ok()?;
    let rest: Vec<&str> = text.get(close + 1..)?.split_whitespace().collect();
    // rest[0] is field 3 (state); field N is rest[N - 3].
    let state = rest.first()?.chars().next()?;
    let pgrp = rest.get(2)?.parse().ok()?;
    let start_time = rest.get(19)?.parse().ok()?;
    Some(ProcStat {
        pid,
        state,
        pgrp,
        start_time,
    })
}

/// Reads `/proc/<pid>/stat`; `Ok(None)` when no such process exists.
pub fn stat(pid: i32) -> io::Result<Option<ProcStat>> {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(text) => parse_stat(&text).map(Some).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("unreadable /proc/{pid}/stat"),
            )
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) if e.raw_os_error() == Some(nix::libc::ESRCH) => Ok(None),
        Err(e) => Err(e),
    }
}

/// This boot's id.
pub fn boot_id() -> io::Result<String> {
    Ok(fs::read_to_string("/proc/sys/kernel/random/boot_id")?
        .trim()
        .to_owned())
}

/// The start identity of a live process.
pub fn identity(pid: i32) -> io::Result<StartIdentity> {
    let stat = stat(pid)?
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("no process {pid}")))?;
    Ok(StartIdentity {
        pid,
        pgid: stat.pgrp,
        start_time: stat.start_time,
        boot_id: boot_id()?,
    })
}

/// Every process currently in process group `pgid`, zombies included.
pub fn group_members(pgid: i32) -> io::Result<Vec<ProcStat>> {
    let mut members = Vec::new();
    for entry in fs::read_dir("/proc")? {
        let Ok(entry) = entry else { continue };
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        // A process can exit between listing and reading: that is not an error.
        if let Ok(Some(stat)) = stat(pid)
            && stat.pgrp == pgid
        {
            members.push(stat);
        }
    }
    Ok(members)
}

/// The members of `pgid` that still run (zombies wait only to be reaped and run nothing).
pub fn live_members(pgid: i32) -> io::Result<Vec<i32>> {
    Ok(group_members(pgid)?
        .into_iter()
        .filter(|s| !s.is_zombie())
        .map(|s| s.pid)
        .collect())
}

/// What a recorded identity proves about the process that holds its pid today.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ownership {
    /// The recorded process is alive; `in_group` says whether it still leads (belongs to)
    /// the recorded process group.
    Proven { in_group: bool },
    /// No process runs under the recorded pid with the recorded start time on this boot, and
    /// nothing runs in the recorded process group.
    Gone,
    /// The recorded leader is gone but processes remain in a group with the recorded number:
    /// they cannot be proven to be ours.
    Unproven { reason: String, remaining: Vec<i32> },
}

/// Compares a recorded identity with what `/proc` says now.
pub fn prove(recorded: &StartIdentity) -> io::Result<Ownership> {
    let boot = boot_id()?;
    let now = stat(recorded.pid)?;
    let leader_is_ours = boot == recorded.boot_id
        && now.is_some_and(|s| s.start_time == recorded.start_time && !s.is_zombie());
    if leader_is_ours {
        let in_group = now.is_some_and(|s| s.pgrp == recorded.pgid);
        return Ok(Ownership::Proven { in_group });
    }
    let remaining = if boot == recorded.boot_id {
        live_members(recorded.pgid)?
    } else {
        Vec::new()
    };
    if remaining.is_empty() {
        return Ok(Ownership::Gone);
    }
    let reason = match now {
        Some(s) if s.start_time != recorded.start_time => format!(
            "pid {} now belongs to a process started at tick {}, not the recorded {}",
            recorded.pid, s.start_time, recorded.start_time
        ),
        _ => format!("the recorded leader (pid {}) has exited", recorded.pid),
    };
    Ok(Ownership::Unproven { reason, remaining })
}

/// A listening TCP socket, from `/proc/net/tcp` or `/proc/net/tcp6`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listener {
    pub local: SocketAddr,
    /// The socket's inode: `/proc/<pid>/fd/<n>` links to `socket:[inode]` in its holders.
    pub inode: u64,
}

impl Listener {
    /// Whether a client dialing `127.0.0.1:<port>` can reach this socket: it listens on
    /// 127.0.0.1, on the IPv4 wildcard, or on an IPv6 address that accepts IPv4 loopback.
    pub fn serves_ipv4_loopback(&self) -> bool {
        match self.local.ip() {
            IpAddr::V4(ip) => ip.is_loopback() || ip.is_unspecified(),
            IpAddr::V6(ip) => {
                ip.is_unspecified() || ip.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
            }
        }
    }
}

/// The parsed address `0100007F:1F90` (IPv4) or 32 hex digits and a port (IPv6), as the
/// kernel prints them: each 32-bit word in host byte order, the port in plain hex.
fn parse_proc_addr(text: &str) -> Option<SocketAddr> {
    let (host, port) = text.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let mut bytes = Vec::with_capacity(16);
    for chunk in host.as_bytes().chunks(8) {
        let word = u32::from_str_radix(std::str::from_utf8(chunk).ok()?, 16).ok()?;
        bytes.extend_from_slice(&word.to_ne_bytes());
    }
    let ip = match bytes.len() {
        4 => IpAddr::V4(Ipv4Addr::new(bytes[0], bytes[1], bytes[2], bytes[3])),
        16 => {
            let mut octets = [0u8; 16];
            octets.copy_from_slice(&bytes);
            IpAddr::V6(Ipv6Addr::from(octets))
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

fn parse_listeners(text: &str, port: u16) -> Vec<Listener> {
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // sl, local, remote, state, tx:rx, tr:when, retransmits, uid, timeout, inode
            if fields.get(3) != Some(&"0A") {
                return None;
            }
            let local = parse_proc_addr(fields.get(1)?)?;
            if local.port() != port {
                return None;
            }
            let inode = fields.get(9)?.parse().ok()?;
            Some(Listener { local, inode })
        })
        .collect()
}

/// Every TCP socket listening on `port`, IPv4 and IPv6.
pub fn tcp_listeners(port: u16) -> io::Result<Vec<Listener>> {
    let mut found = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        match fs::read_to_string(table) {
            Ok(text) => found.extend(parse_listeners(&text, port)),
            // A kernel without IPv6 has no tcp6 table.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(found)
}

/// The socket inodes among `/proc/<pid>/fd`; empty when the process is gone or unreadable.
fn socket_inodes(pid: i32) -> Vec<u64> {
    let Ok(entries) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok())
        .filter_map(|e| fs::read_link(e.path()).ok())
        .filter_map(|target| {
            let text = target.to_str()?;
            text.strip_prefix("socket:[")?
                .strip_suffix(']')?
                .parse()
                .ok()
        })
        .collect()
}

/// Whether process `pid` holds any of `inodes` open.
pub fn holds_any(pid: i32, inodes: &[u64]) -> bool {
    socket_inodes(pid).iter().any(|i| inodes.contains(i))
}

/// Every process (that this user may inspect) holding one of `inodes` open.
pub fn socket_holders(inodes: &[u64]) -> io::Result<Vec<i32>> {
    let mut holders = Vec::new();
    for entry in fs::read_dir("/proc")? {
        let Ok(entry) = entry else { continue };
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        if holds_any(pid, inodes) {
            holders.push(pid);
        }
    }
    Ok(holders)
}

/// The short command name of a process (`/proc/<pid>/comm`).
pub fn comm(pid: i32) -> Option<String> {
    fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|s| s.trim_end().to_owned())
}

/// The command line of a process, its arguments joined by spaces.
pub fn cmdline(pid: i32) -> Option<String> {
    let bytes = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let parts: Vec<String> = bytes
        .split(|&b| b == 0)
        .filter(|p| !p.is_empty())
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .collect();
    Some(parts.join(" "))
}

/// `pid 4242 (python3)`.
pub fn describe(pid: i32) -> String {
    match comm(pid) {
        Some(name) => format!("pid {pid} ({name})"),
        None => format!("pid {pid}"),
    }
}

/// Who holds TCP port `port` in listening state, in words: `127.0.0.1:8080 by pid 42
/// (python3)`, one entry per listening socket; `None` when no socket listens on it.
pub fn describe_port_holders(port: u16) -> Option<String> {
    let listeners = tcp_listeners(port).ok()?;
    if listeners.is_empty() {
        return None;
    }
    let mut parts = Vec::new();
    for listener in &listeners {
        let holders = socket_holders(&[listener.inode]).unwrap_or_default();
        let who = if holders.is_empty() {
            "a process this user cannot inspect".to_owned()
        } else {
            holders
                .iter()
                .map(|&p| describe(p))
                .collect::<Vec<_>>()
                .join(", ")
        };
        parts.push(format!("{} by {who}", listener.local));
    }
    Some(parts.join("; "))
}

/// The addresses beyond loopback on which a member of process group `pgid` listens on
/// `port`: the IPv4 or IPv6 wildcard, or a specific outside address.
pub fn group_listeners_off_loopback(port: u16, pgid: i32) -> Vec<SocketAddr> {
    let Ok(listeners) = tcp_listeners(port) else {
        return Vec::new();
    };
    let outside: Vec<Listener> = listeners
        .into_iter()
        .filter(|l| match l.local.ip() {
            IpAddr::V4(ip) => !ip.is_loopback(),
            IpAddr::V6(ip) => {
                !ip.is_loopback() && !ip.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
            }
        })
        .collect();
    if outside.is_empty() {
        return Vec::new();
    }
    let mut members = live_members(pgid).unwrap_or_default();
    if !members.contains(&pgid) {
        members.push(pgid);
    }
    outside
        .into_iter()
        .filter(|l| members.iter().any(|&pid| holds_any(pid, &[l.inode])))
        .map(|l| l.local)
        .collect()
}

/// Whether the sockets a client of `127.0.0.1:<port>` reaches belong to process group
/// `pgid`: `Ok(())` when every such listener is held by a member of the group, otherwise why
/// not (no listener, or whose it is).
pub fn loopback_listener_owned_by_group(port: u16, pgid: i32) -> Result<(), String> {
    let listeners: Vec<Listener> = tcp_listeners(port)
        .map_err(|e| format!("cannot read the socket tables: {e}"))?
        .into_iter()
        .filter(Listener::serves_ipv4_loopback)
        .collect();
    if listeners.is_empty() {
        return Err(format!("nothing listens on 127.0.0.1:{port}"));
    }
    // The leader usually holds the listener itself: check it before scanning the group.
    let mut members: Option<Vec<i32>> = None;
    for listener in &listeners {
        let inode = [listener.inode];
        if holds_any(pgid, &inode) {
            continue;
        }
        let group = match &members {
            Some(m) => m,
            None => members.insert(live_members(pgid).unwrap_or_default()),
        };
        if group.iter().any(|&pid| holds_any(pid, &inode)) {
            continue;
        }
        let holders = socket_holders(&inode).unwrap_or_default();
        let who = if holders.is_empty() {
            "a process this user cannot inspect".to_owned()
        } else {
            holders
                .iter()
                .map(|&p| describe(p))
                .collect::<Vec<_>>()
                .join(", ")
        };
        return Err(format!(
            "{} is held by {who}, not by a process of this service (process group {pgid})",
            listener.local
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_name_with_spaces_and_parentheses_is_parsed_from_the_last_parenthesis() {
        let line =
            "4242 (a (weird) name) S 1 4240 4240 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 987654 1 2";
        let s = parse_stat(line).unwrap();
        assert_eq!(s.pid, 4242);
        assert_eq!(s.state, 'S');
        assert_eq!(s.pgrp, 4240);
        assert_eq!(s.start_time, 987654);
    }

    #[test]
    fn this_process_has_an_identity_that_proves_itself() {
        let me = identity(std::process::id() as i32).unwrap();
        assert!(matches!(prove(&me).unwrap(), Ownership::Proven { .. }));
        let mut other = me.clone();
        other.start_time += 1;
        // Our own group is alive, but nothing proves the altered record owns it.
        assert!(matches!(prove(&other).unwrap(), Ownership::Unproven { .. }));
    }

    #[test]
    fn listening_sockets_are_parsed_from_both_socket_tables() {
        let v4 = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4711 1 0 100 0 0 10 0
   1: 0100007F:1F90 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 4712 1 0 100 0 0 10 0
   2: 00000000:0050 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4713 1 0 100 0 0 10 0
";
        let found = parse_listeners(v4, 8080);
        assert_eq!(
            found,
            vec![Listener {
                local: "127.0.0.1:8080".parse().unwrap(),
                inode: 4711
            }],
            "an established connection on the port is not a listener"
        );
        let v6 = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000001000000:1F90 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 99 1 0 100 0 0 10 0
";
        let found = parse_listeners(v6, 8080);
        assert_eq!(found[0].local, "[::1]:8080".parse::<SocketAddr>().unwrap());
        assert!(!found[0].serves_ipv4_loopback());
        let wildcard = Listener {
            local: "[::]:8080".parse().unwrap(),
            inode: 1,
        };
        assert!(wildcard.serves_ipv4_loopback());
    }

    #[test]
    fn a_listener_of_this_process_is_found_and_attributed_to_its_group() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let me = identity(std::process::id() as i32).unwrap();
        assert_eq!(loopback_listener_owned_by_group(port, me.pgid), Ok(()));
        let elsewhere = loopback_listener_owned_by_group(port, me.pgid + 1_000_000).unwrap_err();
        assert!(
            elsewhere.contains(&format!("pid {}", me.pid)),
            "the holder is named: {elsewhere}"
        );
        assert!(
            describe_port_holders(port)
                .unwrap()
                .contains(&format!("pid {}", me.pid))
        );
        drop(listener);
        assert!(loopback_listener_owned_by_group(port, me.pgid).is_err());
    }
}
