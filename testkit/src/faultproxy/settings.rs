//! The faults a proxy applies, as plain data: what happens to a new connection at accept, and
//! what happens to the bytes of each direction of every open connection. Owns their meaning
//! and their one-line description (for a history or a log); never touches a socket.

use std::fmt;
use std::time::Duration;

/// Which way bytes travel through the proxy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Direction {
    /// From the connecting side (the client) to the upstream it was proxied to.
    Up,
    /// From the upstream back to the client.
    Down,
    /// Both of the above.
    Both,
}

impl Direction {
    /// Whether this names `one` (which must be `Up` or `Down`).
    pub fn covers(self, one: Direction) -> bool {
        self == Direction::Both || self == one
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Up => "up",
            Direction::Down => "down",
            Direction::Both => "both",
        }
    }
}

/// How a connection is ended by the proxy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Cut {
    /// An abortive close (`SO_LINGER` 0): the peer's next read or write fails with
    /// `ECONNRESET`, as when a middlebox or a dead machine resets the link.
    #[default]
    Reset,
    /// An orderly close: the peer reads end-of-stream (the kernel may still reset a socket
    /// that is closed with bytes it has not read).
    Close,
}

impl Cut {
    pub fn as_str(self) -> &'static str {
        match self {
            Cut::Reset => "reset",
            Cut::Close => "close",
        }
    }
}

/// What the proxy does with a connection it accepts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum AcceptFault {
    /// Proxied to the upstream.
    #[default]
    Pass,
    /// Ended at once, the way `how` says: the client's connect succeeds (the kernel completes
    /// the handshake before the proxy sees it) and its first read fails or ends.
    Drop(Cut),
    /// Held open and silent: nothing is read, nothing is answered, nothing is closed. When the
    /// black hole ends, a held connection is proxied like a new one (as a link whose partition
    /// healed before either side gave up on it); a cut ends it like any other.
    BlackHole,
}

/// What happens to the bytes of one direction of every open connection. A change applies at
/// once, to bytes already queued as well as to new ones.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct LinkFault {
    /// Every chunk is held back this long after it was read.
    pub delay: Duration,
    /// Plus a uniform random share of this, drawn per chunk. Chunks are never reordered
    /// (a byte stream cannot be): a chunk drawn shorter waits behind the one before it.
    pub jitter: Duration,
    /// At most this many bytes a second are written on (`None`: no limit).
    pub bytes_per_second: Option<u64>,
    /// Nothing flows: no byte is read from the sender (its socket buffers fill and its writes
    /// block, as in a partition) and no queued byte is delivered. Bytes are held, not lost:
    /// they flow again when the stall ends.
    pub stalled: bool,
}

impl LinkFault {
    /// True when bytes pass untouched.
    pub fn is_pass(&self) -> bool {
        *self == LinkFault::default()
    }
}

/// Every fault a proxy applies at one time. `Faults::default()` passes everything.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Faults {
    pub accept: AcceptFault,
    /// Client to upstream.
    pub up: LinkFault,
    /// Upstream to client.
    pub down: LinkFault,
}

impl Faults {
    /// True when the proxy passes everything.
    pub fn is_pass(&self) -> bool {
        *self == Faults::default()
    }

    /// The fault of one direction (`Up` or `Down`; `Both` reads `Up`).
    pub fn link(&self, one: Direction) -> &LinkFault {
        match one {
            Direction::Down => &self.down,
            Direction::Up | Direction::Both => &self.up,
        }
    }

    /// Changes the fault of each direction `dir` covers.
    pub fn each_link(&mut self, dir: Direction, mut change: impl FnMut(&mut LinkFault)) {
        if dir.covers(Direction::Up) {
            change(&mut self.up);
        }
        if dir.covers(Direction::Down) {
            change(&mut self.down);
        }
    }
}

fn describe_link(f: &mut fmt::Formatter<'_>, name: &str, l: &LinkFault) -> fmt::Result {
    if l.is_pass() {
        return Ok(());
    }
    write!(f, " {name}:")?;
    if l.stalled {
        write!(f, " stalled")?;
    }
    if !l.delay.is_zero() || !l.jitter.is_zero() {
        write!(f, " delay {:?}", l.delay)?;
        if !l.jitter.is_zero() {
            write!(f, "+0..{:?}", l.jitter)?;
        }
    }
    if let Some(b) = l.bytes_per_second {
        write!(f, " {b} B/s")?;
    }
    Ok(())
}

impl fmt::Display for Faults {
    /// One line: `pass`, or e.g. `accept: black-hole up: stalled down: stalled`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_pass() {
            return write!(f, "pass");
        }
        match self.accept {
            AcceptFault::Pass => write!(f, "accept: pass")?,
            AcceptFault::Drop(how) => write!(f, "accept: drop ({})", how.as_str())?,
            AcceptFault::BlackHole => write!(f, "accept: black-hole")?,
        }
        describe_link(f, "up", &self.up)?;
        describe_link(f, "down", &self.down)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_passes_and_describes_itself_as_pass() {
        assert!(Faults::default().is_pass());
        assert_eq!(Faults::default().to_string(), "pass");
    }

    #[test]
    fn a_description_names_each_fault_of_each_direction() {
        let mut f = Faults {
            accept: AcceptFault::BlackHole,
            ..Faults::default()
        };
        f.each_link(Direction::Both, |l| l.stalled = true);
        f.down.delay = Duration::from_millis(100);
        f.down.jitter = Duration::from_millis(50);
        f.up.bytes_per_second = Some(1000);
        assert_eq!(
            f.to_string(),
            "accept: black-hole up: stalled 1000 B/s down: stalled delay 100ms+0..50ms"
        );
    }

    #[test]
    fn each_link_changes_only_the_directions_named() {
        let mut f = Faults::default();
        f.each_link(Direction::Down, |l| l.stalled = true);
        assert!(!f.up.stalled);
        assert!(f.down.stalled);
        assert!(f.link(Direction::Down).stalled);
    }
}
