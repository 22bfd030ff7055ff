//! The guard beside a handler: a member of the handler's process group that stops the whole
//! group when its invoker dies. Owns the guard process from spawn to reap and the one pipe
//! whose write end only the invoker holds.
//!
//! The guard is `/bin/sh` running a five-line script (no binary of ours to install, no
//! `unsafe` to set a parent-death signal). It ignores SIGTERM and blocks reading its stdin:
//! - a line arrives ([`Guard::release`]): the invocation ended under the invoker's own
//!   supervision, and the guard exits without signalling anything;
//! - end-of-file arrives: the invoker died (any signal, SIGKILL included: the kernel closes
//!   its descriptors) or dropped the invocation. The guard sends SIGTERM to the group, waits
//!   the grace and sends SIGKILL to the group, which ends the guard too.
//!
//! Because the guard is itself a member, the group number cannot be reused while it signals
//! it, even if the handler's leader was reaped by init meanwhile.
//!
//! This module must never signal anything but the guard's own pid (the group is the guard's
//! to signal, or the invoker's through [`crate::invoke`]).

use std::io::Write as _;
use std::os::unix::process::CommandExt as _;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The program the guard runs in.
const SHELL: &str = "/bin/sh";

/// The guard's script: `$1` is the group, `$2` the grace in seconds.
const SCRIPT: &str = "trap '' TERM INT HUP
if IFS= read -r line; then exit 0; fi
kill -s TERM -- \"-$1\" 2>/dev/null
sleep \"$2\"
kill -s KILL -- \"-$1\" 2>/dev/null
";

/// The name the guard shows in `ps` (its `$0`).
pub const GUARD_NAME: &str = "hostd-guard";

/// The most a handler gets between SIGTERM and SIGKILL once its invoker is dead: nobody is
/// left to read a result, and the whole stop must fit well inside two seconds.
pub const MAX_ORPHAN_GRACE: Duration = Duration::from_millis(500);

/// The grace the guard gives an orphaned group: the invocation's own grace, at most
/// [`MAX_ORPHAN_GRACE`].
pub fn orphan_grace(kill_grace: Duration) -> Duration {
    kill_grace.min(MAX_ORPHAN_GRACE)
}

/// A running guard of one handler group.
pub struct Guard {
    child: Child,
}

impl Guard {
    /// Starts the guard of the group led by `pgid` (alive or an unreaped zombie, so the group
    /// exists to be joined). `None` (with a warning) when it cannot start: the handler then
    /// runs unguarded, covered only by the boot sweep of running records.
    pub fn spawn(pgid: i32, grace: Duration) -> Option<Guard> {
        let spawned = Command::new(SHELL)
            .arg("-c")
            .arg(SCRIPT)
            .arg(GUARD_NAME)
            .arg(pgid.to_string())
            .arg(format!("{:.3}", grace.as_secs_f64()))
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(pgid)
            .spawn();
        match spawned {
            Ok(child) => Some(Guard { child }),
            Err(e) => {
                tracing::warn!(pgid, error = %e, "cannot start the handler's guard; the handler would outlive a crash of this process until the next start");
                None
            }
        }
    }

    /// The guard's pid (a member of the handler's group).
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Tells the guard the invocation ended (it exits without signalling) and reaps it. A
    /// guard that does not exit within a second is killed (its pid only) and reaped.
    pub async fn release(mut self) {
        if let Some(mut stdin) = self.child.stdin.take() {
            // A guard already gone (killed with the group) makes this fail: nothing to say.
            let _ = stdin.write_all(b"done\n");
        }
        let until = tokio::time::Instant::now() + Duration::from_secs(1);
        loop {
            match self.child.try_wait() {
                Ok(Some(_)) => return,
                Ok(None) if tokio::time::Instant::now() < until => {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Ok(None) | Err(_) => break,
            }
        }
        let _ = self.child.kill();
        if let Err(e) = self.child.wait() {
            tracing::warn!(pid = self.pid(), error = %e, "cannot reap the handler's guard");
        }
    }
}
