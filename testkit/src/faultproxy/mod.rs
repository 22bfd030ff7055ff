//! A TCP proxy on loopback for fault tests: put it between two real endpoints (a Host and its
//! PostgreSQL server, a client and a Host) and switch network faults on and off while they
//! talk, through a cheap cloneable [`ProxyHandle`]:
//!
//! | fault | what the endpoints see |
//! |---|---|
//! | pass ([`ProxyHandle::heal`]) | a plain link |
//! | delay, fixed and jittered, per direction ([`ProxyHandle::delay`]) | every chunk held back; never reordered |
//! | bandwidth limit ([`ProxyHandle::bandwidth`]) | at most so many bytes a second each way |
//! | drop new connections ([`ProxyHandle::drop_new`]) | connect succeeds, then a reset or an end of stream |
//! | black hole ([`ProxyHandle::black_hole`]) | new connections accepted and never answered; open ones go silent both ways; nothing is closed |
//! | cut all open connections ([`ProxyHandle::cut_all`]) | a reset (or an orderly close) on both sides of each |
//! | half-open ([`ProxyHandle::half_open`]) | one direction stops (its bytes held, not lost) while the other flows |
//!
//! Faults compose ([`ProxyHandle::update`] edits the whole [`Faults`] at once) and a change
//! applies at once to open connections as well as new ones. [`ProxyHandle::stats`] counts
//! connections accepted, dropped, held, cut and open, and the bytes delivered each way.
//!
//! ```no_run
//! # async fn demo(postgres: std::net::SocketAddr) -> std::io::Result<()> {
//! use std::time::Duration;
//! use testkit::faultproxy::{Cut, Direction, FaultProxy};
//!
//! let proxy = FaultProxy::start(postgres).await?;
//! let url = format!("postgres://postgres@{}/test", proxy.addr()); // give this to the Host
//! let link = proxy.handle();
//! link.delay(Direction::Both, Duration::from_millis(100), Duration::from_millis(20));
//! link.black_hole(); // a partition: silence, not refusal
//! link.heal(); // held bytes flow again
//! link.cut_all(Cut::Reset); // every open connection reset
//! proxy.shutdown().await; // closes every connection and waits for its tasks
//! # Ok(()) }
//! ```
//!
//! Owns its listener, every proxied connection and their counters. It needs no root and no
//! network namespace (everything is on loopback), never panics on an I/O error (a failed
//! socket ends that one connection, a failed accept is retried) and never outlives its
//! [`FaultProxy`]: dropping it aborts every task; [`FaultProxy::shutdown`] closes every
//! connection and waits for them.

mod connection;
mod pump;
mod settings;
mod stats;

use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

pub use settings::{AcceptFault, Cut, Direction, Faults, LinkFault};
pub use stats::ProxyStats;

use stats::Counters;

/// Orders every connection follows: cuts (counted, so a connection born after a cut is not
/// touched by it) and the stop.
#[derive(Clone, Copy, Debug, Default)]
struct Control {
    cuts: u64,
    last_cut: Cut,
    stopping: bool,
}

/// What the listener, every connection and every handle share.
struct Shared {
    addr: SocketAddr,
    upstream: Mutex<SocketAddr>,
    faults: watch::Sender<Faults>,
    control: watch::Sender<Control>,
    stats: Counters,
}

impl Shared {
    fn upstream(&self) -> SocketAddr {
        match self.upstream.lock() {
            Ok(a) => *a,
            Err(poisoned) => *poisoned.into_inner(),
        }
    }
}

/// A running proxy. Dropping it aborts its listener and every connection at once; prefer
/// [`FaultProxy::shutdown`], which closes them in order and waits.
pub struct FaultProxy {
    handle: ProxyHandle,
    task: Option<JoinHandle<()>>,
}

impl FaultProxy {
    /// Listens on a free loopback port and proxies every connection to `upstream`, passing
    /// everything until told otherwise.
    pub async fn start(upstream: SocketAddr) -> io::Result<FaultProxy> {
        FaultProxy::start_on(SocketAddr::from(([127, 0, 0, 1], 0)), upstream).await
    }

    /// Listens on `listen` (port 0 for a free one) and proxies to `upstream`.
    pub async fn start_on(listen: SocketAddr, upstream: SocketAddr) -> io::Result<FaultProxy> {
        let listener = TcpListener::bind(listen).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            addr,
            upstream: Mutex::new(upstream),
            faults: watch::Sender::new(Faults::default()),
            control: watch::Sender::new(Control::default()),
            stats: Counters::default(),
        });
        let task = tokio::spawn(listen_loop(listener, shared.clone()));
        Ok(FaultProxy {
            handle: ProxyHandle { shared },
            task: Some(task),
        })
    }

    /// The address clients dial.
    pub fn addr(&self) -> SocketAddr {
        self.handle.addr()
    }

    /// A handle to switch faults and read counters (cheap to clone, usable from any task).
    pub fn handle(&self) -> ProxyHandle {
        self.handle.clone()
    }

    /// Stops accepting, closes every open connection (held ones too) and waits until every
    /// task of the proxy has ended.
    pub async fn shutdown(mut self) {
        self.handle
            .shared
            .control
            .send_modify(|c| c.stopping = true);
        if let Some(task) = self.task.take() {
            // A panic cannot come from here (the tasks return on every error); a join error
            // can only be a cancellation, which is the end we wanted anyway.
            let _ = task.await;
        }
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            // The listener task owns the connections' JoinSet: aborting it drops the set,
            // which aborts every connection.
            task.abort();
        }
    }
}

/// Switches a proxy's faults and reads its counters. Cheap to clone; every method applies at
/// once to open connections as well as new ones. A handle that outlives its proxy changes
/// nothing.
#[derive(Clone)]
pub struct ProxyHandle {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for ProxyHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxyHandle")
            .field("addr", &self.shared.addr)
            .field("upstream", &self.shared.upstream())
            .field("faults", &*self.shared.faults.borrow())
            .finish()
    }
}

impl ProxyHandle {
    /// The address clients dial.
    pub fn addr(&self) -> SocketAddr {
        self.shared.addr
    }

    /// Where connections are proxied to.
    pub fn upstream(&self) -> SocketAddr {
        self.shared.upstream()
    }

    /// Proxies connections made from now on to `upstream` (open ones stay where they are).
    pub fn set_upstream(&self, upstream: SocketAddr) {
        match self.shared.upstream.lock() {
            Ok(mut a) => *a = upstream,
            Err(poisoned) => *poisoned.into_inner() = upstream,
        }
    }

    /// The faults in force.
    pub fn faults(&self) -> Faults {
        *self.shared.faults.borrow()
    }

    /// Replaces every fault at once.
    pub fn set(&self, faults: Faults) {
        self.shared.faults.send_replace(faults);
    }

    /// Edits the faults in force, as one change.
    pub fn update(&self, change: impl FnOnce(&mut Faults)) {
        self.shared.faults.send_modify(change);
    }

    /// Passes everything again: no delay, no limit, nothing dropped, held or stalled. Bytes a
    /// stall or a black hole held flow on; connections a black hole held are proxied.
    pub fn heal(&self) {
        self.set(Faults::default());
    }

    /// Holds every chunk of `dir` back `delay` plus a uniform random share of `jitter`.
    pub fn delay(&self, dir: Direction, delay: Duration, jitter: Duration) {
        self.update(|f| {
            f.each_link(dir, |l| {
                l.delay = delay;
                l.jitter = jitter;
            })
        });
    }

    /// Limits `dir` to `bytes_per_second` (`None` lifts the limit).
    pub fn bandwidth(&self, dir: Direction, bytes_per_second: Option<u64>) {
        self.update(|f| f.each_link(dir, |l| l.bytes_per_second = bytes_per_second));
    }

    /// Ends every new connection at accept, the way `how` says (open ones are untouched).
    pub fn drop_new(&self, how: Cut) {
        self.update(|f| f.accept = AcceptFault::Drop(how));
    }

    /// A partition: new connections are accepted and never answered, open ones go silent
    /// both ways; nothing is closed.
    pub fn black_hole(&self) {
        self.update(|f| {
            f.accept = AcceptFault::BlackHole;
            f.each_link(Direction::Both, |l| l.stalled = true);
        });
    }

    /// Stops `stopped` (its bytes are held, not lost) while the other direction flows.
    pub fn half_open(&self, stopped: Direction) {
        self.update(|f| f.each_link(stopped, |l| l.stalled = true));
    }

    /// Ends every connection open now (held ones too), on both sides, the way `how` says.
    /// Connections made afterwards are untouched.
    pub fn cut_all(&self, how: Cut) {
        self.shared.control.send_modify(|c| {
            c.cuts += 1;
            c.last_cut = how;
        });
    }

    /// The counters so far.
    pub fn stats(&self) -> ProxyStats {
        self.shared.stats.snapshot()
    }
}

/// Accepts until the proxy stops, then waits for every connection to end.
async fn listen_loop(listener: TcpListener, shared: Arc<Shared>) {
    let mut control = shared.control.subscribe();
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            changed = control.changed() => {
                if changed.is_err() || control.borrow_and_update().stopping {
                    break;
                }
            }
            accepted = listener.accept() => match accepted {
                Ok((socket, _)) => admit(socket, &shared, &mut connections),
                // Out of descriptors or a connection reset before accept: try again shortly
                // rather than spin.
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    drop(listener);
    while connections.join_next().await.is_some() {}
}

fn admit(socket: TcpStream, shared: &Arc<Shared>, connections: &mut JoinSet<()>) {
    Counters::bump(&shared.stats.accepted);
    let accept = shared.faults.borrow().accept;
    if let AcceptFault::Drop(how) = accept {
        Counters::bump(&shared.stats.dropped);
        connection::close(socket, how);
        return;
    }
    let born = shared.control.borrow().cuts;
    connections.spawn(connection::serve(socket, shared.clone(), born));
}
