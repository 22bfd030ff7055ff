//! Reading process facts from Linux `/proc`: a process's start identity (pid, process group,
//! start time since boot, boot id) and the live members of a process group.
//!
//! This module owns *reading* only, which is what ownership proofs are built from. It must
//! never send a signal or decide that something may be signalled.

use std::fs;
use std::io;

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
        // One cheap syscall filters the candidates; only members have their stat read. A
        // process can exit between listing and reading: that is not an error.
        if nix::unistd::getpgid(Some(nix::unistd::Pid::from_raw(pid)))
            .is_ok_and(|g| g.as_raw() == pgid)
            && let Ok(Some(stat)) = stat(pid)
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
}
