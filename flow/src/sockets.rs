//! Who listens where: the TCP sockets in LISTEN state on a port (from the kernel's socket
//! diagnostics, or `/proc/net/tcp{,6}`), and which processes hold them (from
//! `/proc/<pid>/fd`). Readiness uses it to check that what answers on a service's port is
//! the service's own process group; the port check uses it to name a squatter.
//!
//! This module owns reading socket facts only. It must never bind, connect or signal.

use std::fs;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::procfs;

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

/// Every TCP socket listening on `port`, IPv4 and IPv6: asked of the kernel's socket
/// diagnostics (netlink), which walks only the listening sockets; read from
/// `/proc/net/tcp{,6}` (which walks every connection bucket, and is slow on a large
/// machine) when netlink is not available.
pub fn tcp_listeners(port: u16) -> io::Result<Vec<Listener>> {
    match diag::listeners() {
        Ok(all) => Ok(all.into_iter().filter(|l| l.local.port() == port).collect()),
        Err(e) => {
            tracing::debug!(error = %e, "socket diagnostics unavailable; reading /proc/net/tcp");
            proc_listeners(port)
        }
    }
}

fn proc_listeners(port: u16) -> io::Result<Vec<Listener>> {
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

/// The kernel's socket diagnostics over netlink (`NETLINK_SOCK_DIAG`): a dump of the TCP
/// sockets in LISTEN state, IPv4 then IPv6.
mod diag {
    use std::io;
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
    use std::os::fd::AsRawFd;

    use nix::sys::socket::{
        AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType, recv, sendto,
        socket,
    };

    use super::Listener;

    const SOCK_DIAG_BY_FAMILY: u16 = 20;
    const NLM_F_REQUEST: u16 = 0x1;
    const NLM_F_DUMP: u16 = 0x300;
    const NLMSG_ERROR: u16 = 2;
    const NLMSG_DONE: u16 = 3;
    const TCP_LISTEN: u32 = 10;
    const IPPROTO_TCP: u8 = 6;
    const HEADER: usize = 16;
    /// family, state, timer, retrans, then the 48-byte socket id, then expires, rqueue,
    /// wqueue, uid and inode.
    const MESSAGE: usize = 72;

    fn request(family: u8, seq: u32) -> Vec<u8> {
        let mut m = Vec::with_capacity(HEADER + 56);
        m.extend_from_slice(&((HEADER + 56) as u32).to_ne_bytes());
        m.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
        m.extend_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
        m.extend_from_slice(&seq.to_ne_bytes());
        m.extend_from_slice(&0u32.to_ne_bytes());
        // inet_diag_req_v2: family, protocol, extensions, pad, states, then a zeroed id
        // (a dump matches every socket id) whose cookie is "no cookie".
        m.extend_from_slice(&[family, IPPROTO_TCP, 0, 0]);
        m.extend_from_slice(&(1u32 << TCP_LISTEN).to_ne_bytes());
        m.extend_from_slice(&[0u8; 40]);
        m.extend_from_slice(&u32::MAX.to_ne_bytes());
        m.extend_from_slice(&u32::MAX.to_ne_bytes());
        m
    }

    fn u32_at(b: &[u8], at: usize) -> Option<u32> {
        Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
    }

    fn u16_at(b: &[u8], at: usize) -> Option<u16> {
        Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
    }

    fn parse(body: &[u8]) -> Option<Listener> {
        if body.len() < MESSAGE {
            return None;
        }
        let family = body[0];
        let port = u16::from_be_bytes([body[4], body[5]]);
        let src = &body[8..24];
        let ip = if family == AddressFamily::Inet6 as u8 {
            let mut octets = [0u8; 16];
            octets.copy_from_slice(src);
            IpAddr::V6(Ipv6Addr::from(octets))
        } else {
            IpAddr::V4(Ipv4Addr::new(src[0], src[1], src[2], src[3]))
        };
        let inode = u32_at(body, 68)?;
        Some(Listener {
            local: SocketAddr::new(ip, port),
            inode: u64::from(inode),
        })
    }

    fn dump(family: AddressFamily, seq: u32) -> io::Result<Vec<Listener>> {
        let fd = socket(
            AddressFamily::Netlink,
            SockType::Raw,
            SockFlag::SOCK_CLOEXEC,
            SockProtocol::NetlinkSockDiag,
        )?;
        let raw = fd.as_raw_fd();
        sendto(
            raw,
            &request(family as u8, seq),
            &NetlinkAddr::new(0, 0),
            MsgFlags::empty(),
        )?;
        let mut found = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = recv(raw, &mut buf, MsgFlags::empty())?;
            if n == 0 {
                return Ok(found);
            }
            let mut at = 0;
            while at + HEADER <= n {
                let len = u32_at(&buf, at).unwrap_or(0) as usize;
                let kind = u16_at(&buf, at + 4).unwrap_or(0);
                if len < HEADER || at + len > n {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "a malformed socket diagnostics message",
                    ));
                }
                match kind {
                    NLMSG_DONE => return Ok(found),
                    NLMSG_ERROR => {
                        let errno = u32_at(&buf, at + HEADER).unwrap_or(0) as i32;
                        return Err(io::Error::from_raw_os_error(errno.saturating_neg()));
                    }
                    SOCK_DIAG_BY_FAMILY => {
                        if let Some(l) = parse(&buf[at + HEADER..at + len]) {
                            found.push(l);
                        }
                    }
                    _ => {}
                }
                // Messages are aligned to 4 bytes.
                at += (len + 3) & !3;
            }
        }
    }

    pub fn listeners() -> io::Result<Vec<Listener>> {
        let mut all = dump(AddressFamily::Inet, 1)?;
        match dump(AddressFamily::Inet6, 2) {
            Ok(v6) => all.extend(v6),
            // A kernel without IPv6 refuses the family; IPv4 is the answer then.
            Err(e) if e.raw_os_error() == Some(nix::libc::EAFNOSUPPORT) => {}
            Err(e) if e.raw_os_error() == Some(nix::libc::ENOENT) => {}
            Err(e) => return Err(e),
        }
        Ok(all)
    }
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
                .map(|&p| procfs::describe(p))
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
    let mut members = procfs::live_members(pgid).unwrap_or_default();
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
            None => members.insert(procfs::live_members(pgid).unwrap_or_default()),
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
                .map(|&p| procfs::describe(p))
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
        let me = procfs::identity(std::process::id() as i32).unwrap();
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

    #[test]
    fn the_kernels_socket_diagnostics_agree_with_the_proc_tables() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let from_netlink: Vec<Listener> = diag::listeners()
            .unwrap()
            .into_iter()
            .filter(|l| l.local.port() == port)
            .collect();
        assert_eq!(from_netlink, proc_listeners(port).unwrap());
        assert_eq!(from_netlink.len(), 1);
    }
}
