//! The nemesis proper: which fault, on which Host, when and for how long, drawn from the
//! run's seed, and each one injected through the fleet (a signal to a process, a setting of a
//! fault proxy), recorded in the history, printed, and healed when its time is up. At most two
//! faults at once, and at most one of them a process fault (kill or freeze), so the fleet
//! keeps a majority running. Owns the choice and the clock of faults; never touches a store.

use std::collections::BTreeMap;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use testkit::faultproxy::{Cut, Direction, ProxyHandle};
use testkit::history::Recorder;
use tokio::time::Instant;
use wire_enum::wire_enum;

use crate::fleet::Fleet;

wire_enum! {
    /// A fault the nemesis injects. `store_*` act on a Host's link to PostgreSQL, `link_*` on
    /// its clients' links to it.
    #[derive(PartialOrd, Ord)]
    pub enum FaultKind {
        /// SIGKILL, then a relaunch under the same id after a while.
        Kill = "kill",
        /// SIGSTOP, then SIGCONT after a while.
        Freeze = "freeze",
        StoreDelay = "store_delay",
        StoreBandwidth = "store_bandwidth",
        StoreBlackHole = "store_black_hole",
        StoreHalfOpen = "store_half_open",
        StoreCut = "store_cut",
        StoreDropNew = "store_drop_new",
        LinkDelay = "link_delay",
        LinkBandwidth = "link_bandwidth",
        LinkBlackHole = "link_black_hole",
        LinkHalfOpen = "link_half_open",
        LinkCut = "link_cut",
        LinkDropNew = "link_drop_new",
    }
    kind = "fault";
}

impl FaultKind {
    /// How often it is drawn, relative to the others.
    fn weight(self) -> u32 {
        match self {
            FaultKind::Kill => 3,
            FaultKind::Freeze => 2,
            FaultKind::StoreDelay | FaultKind::StoreBlackHole | FaultKind::StoreHalfOpen => 2,
            FaultKind::StoreCut | FaultKind::LinkBlackHole | FaultKind::LinkHalfOpen => 2,
            FaultKind::LinkCut => 2,
            FaultKind::StoreBandwidth | FaultKind::StoreDropNew => 1,
            FaultKind::LinkDelay | FaultKind::LinkBandwidth | FaultKind::LinkDropNew => 1,
        }
    }

    fn is_process(self) -> bool {
        matches!(self, FaultKind::Kill | FaultKind::Freeze)
    }

    fn is_store(self) -> bool {
        self.as_str().starts_with("store_")
    }

    /// Which of a Host's three fault targets it occupies (its process, its store link, its
    /// client link).
    fn target(self) -> u8 {
        if self.is_process() {
            0
        } else if self.is_store() {
            1
        } else {
            2
        }
    }
}

/// A fault in force, healed at `until`.
struct Active {
    kind: FaultKind,
    host: usize,
    until: Instant,
}

/// The schedule's own random stream (the workload has its own, so a change to one does not
/// shift the other's choices).
pub struct Schedule {
    rng: StdRng,
    mean_pause: Duration,
    active: Vec<Active>,
    started: Instant,
    pub injected: BTreeMap<FaultKind, usize>,
    /// Hosts that exited on their own (not by a fault of ours), as name and status.
    pub unexpected_exits: Vec<(String, String)>,
}

impl Schedule {
    pub fn new(seed: u64, mean_pause: Duration) -> Schedule {
        Schedule {
            rng: StdRng::seed_from_u64(seed.rotate_left(17) ^ 0x6e65_6d65_7369_7321),
            mean_pause,
            active: Vec::new(),
            started: Instant::now(),
            injected: BTreeMap::new(),
            unexpected_exits: Vec::new(),
        }
    }

    fn say(&self, line: &str) {
        println!("{:>8.1}s {line}", self.started.elapsed().as_secs_f64());
    }

    /// Injects faults until `deadline`, then heals the ones still in force.
    pub async fn run(&mut self, fleet: &mut Fleet, history: &Recorder, deadline: Instant) {
        while Instant::now() < deadline {
            let pause = self.mean_pause.mul_f64(self.rng.random_range(0.5..1.5));
            let wake = (Instant::now() + pause).min(deadline);
            // Heal what falls due during the pause, on time.
            loop {
                let next_heal = self.active.iter().map(|a| a.until).min();
                match next_heal {
                    Some(at) if at < wake => {
                        tokio::time::sleep_until(at).await;
                        self.heal_due(fleet, history);
                    }
                    _ => break,
                }
            }
            tokio::time::sleep_until(wake).await;
            self.heal_due(fleet, history);
            self.reap(fleet, history);
            if Instant::now() < deadline && self.active.len() < 2 {
                self.inject(fleet, history);
            }
        }
        for a in std::mem::take(&mut self.active) {
            self.heal(fleet, history, &a);
        }
        self.reap(fleet, history);
    }

    /// Hosts that exited on their own are recorded and launched again.
    fn reap(&mut self, fleet: &mut Fleet, history: &Recorder) {
        for (name, status, tail) in fleet.exited() {
            let line = format!("{name} exited on its own ({status}); its log ends:\n{tail}");
            self.say(&format!("NOTE {line}"));
            history.note(None, line);
            self.unexpected_exits
                .push((name.clone(), status.to_string()));
            if let Some(i) = fleet.hosts.iter().position(|h| h.name == name)
                && let Err(e) = fleet.launch(i)
            {
                self.say(&format!("NOTE relaunching {name} failed: {e}"));
            }
        }
    }

    fn heal_due(&mut self, fleet: &mut Fleet, history: &Recorder) {
        let now = Instant::now();
        let (due, kept): (Vec<Active>, Vec<Active>) = std::mem::take(&mut self.active)
            .into_iter()
            .partition(|a| a.until <= now);
        self.active = kept;
        for a in due {
            self.heal(fleet, history, &a);
        }
    }

    fn heal(&mut self, fleet: &mut Fleet, history: &Recorder, a: &Active) {
        let name = fleet.hosts[a.host].name.clone();
        let detail = match a.kind {
            FaultKind::Kill => match fleet.launch(a.host) {
                Ok(()) => format!("{name} relaunched"),
                Err(e) => format!("{name} could not be relaunched: {e}"),
            },
            FaultKind::Freeze => {
                fleet.thaw(a.host);
                format!("{name} thawed (SIGCONT)")
            }
            k if k.is_store() => {
                if let Some(h) = fleet.store_link(a.host) {
                    h.heal();
                }
                format!("{name}'s store link passes again")
            }
            _ => {
                fleet.link(a.host).heal();
                format!("{name}'s client link passes again")
            }
        };
        self.say(&format!("heal  {} — {detail}", a.kind));
        history.fault("heal", format!("{}: {detail}", a.kind));
    }

    /// Draws a fault the fleet can take now and injects it.
    fn inject(&mut self, fleet: &mut Fleet, history: &Recorder) {
        let store = fleet.hosts.iter().all(|h| h.store.is_some());
        let kinds: Vec<FaultKind> = FaultKind::ALL
            .iter()
            .copied()
            .filter(|k| store || !k.is_store())
            .filter(|k| !k.is_process() || self.active.iter().all(|a| !a.kind.is_process()))
            .collect();
        let total: u32 = kinds.iter().map(|k| k.weight()).sum();
        let mut roll = self.rng.random_range(0..total);
        let Some(kind) = kinds.iter().copied().find(|k| {
            if roll < k.weight() {
                true
            } else {
                roll -= k.weight();
                false
            }
        }) else {
            return;
        };
        let host = self.rng.random_range(0..fleet.hosts.len());
        if self
            .active
            .iter()
            .any(|a| a.host == host && a.kind.target() == kind.target())
        {
            return; // that target is already faulted: draw again at the next tick
        }
        if kind.is_process() && !fleet.hosts[host].running() {
            return;
        }
        let name = fleet.hosts[host].name.clone();
        let pid = fleet.hosts[host].pid().unwrap_or(0);
        let secs =
            |rng: &mut StdRng, lo: f64, hi: f64| Duration::from_secs_f64(rng.random_range(lo..hi));
        let ms =
            |rng: &mut StdRng, lo: u64, hi: u64| Duration::from_millis(rng.random_range(lo..hi));
        let proxy: Option<ProxyHandle> = if kind.is_process() {
            None
        } else if kind.is_store() {
            fleet.store_link(host)
        } else {
            Some(fleet.link(host))
        };
        let (lasts, detail) = match kind {
            FaultKind::Kill => {
                fleet.kill(host);
                let down = secs(&mut self.rng, 0.5, 5.0);
                (
                    Some(down),
                    format!("SIGKILL {name} (pid {pid}); relaunched in {down:.1?}"),
                )
            }
            FaultKind::Freeze => {
                fleet.freeze(host);
                let frozen = secs(&mut self.rng, 1.0, 8.0);
                (
                    Some(frozen),
                    format!("SIGSTOP {name} (pid {pid}) for {frozen:.1?}"),
                )
            }
            FaultKind::StoreDelay | FaultKind::LinkDelay => {
                let (delay, jitter) = (ms(&mut self.rng, 20, 250), ms(&mut self.rng, 0, 100));
                let lasts = secs(&mut self.rng, 3.0, 10.0);
                let dir = self.direction(true);
                if let Some(p) = &proxy {
                    p.delay(dir, delay, jitter);
                }
                (
                    Some(lasts),
                    format!(
                        "{name}: {} delayed {delay:?} + up to {jitter:?} for {lasts:.1?}",
                        dir.as_str()
                    ),
                )
            }
            FaultKind::StoreBandwidth | FaultKind::LinkBandwidth => {
                let rate = self.rng.random_range(2_000..20_000u64);
                let lasts = secs(&mut self.rng, 2.0, 8.0);
                let dir = self.direction(true);
                if let Some(p) = &proxy {
                    p.bandwidth(dir, Some(rate));
                }
                (
                    Some(lasts),
                    format!(
                        "{name}: {} limited to {rate} B/s for {lasts:.1?}",
                        dir.as_str()
                    ),
                )
            }
            FaultKind::StoreBlackHole | FaultKind::LinkBlackHole => {
                let lasts = secs(&mut self.rng, 2.0, 10.0);
                if let Some(p) = &proxy {
                    p.black_hole();
                }
                (Some(lasts), format!("{name}: black hole for {lasts:.1?}"))
            }
            FaultKind::StoreHalfOpen | FaultKind::LinkHalfOpen => {
                let lasts = secs(&mut self.rng, 2.0, 8.0);
                let dir = self.direction(false);
                if let Some(p) = &proxy {
                    p.half_open(dir);
                }
                (
                    Some(lasts),
                    format!(
                        "{name}: half-open, {} stopped for {lasts:.1?}",
                        dir.as_str()
                    ),
                )
            }
            FaultKind::StoreCut | FaultKind::LinkCut => {
                let how = self.cut();
                let open = proxy.as_ref().map_or(0, |p| p.stats().open);
                if let Some(p) = &proxy {
                    p.cut_all(how);
                }
                (
                    None,
                    format!("{name}: {open} open connections cut ({})", how.as_str()),
                )
            }
            FaultKind::StoreDropNew | FaultKind::LinkDropNew => {
                let how = self.cut();
                let lasts = secs(&mut self.rng, 2.0, 6.0);
                if let Some(p) = &proxy {
                    p.drop_new(how);
                }
                (
                    Some(lasts),
                    format!(
                        "{name}: new connections dropped ({}) for {lasts:.1?}",
                        how.as_str()
                    ),
                )
            }
        };
        *self.injected.entry(kind).or_default() += 1;
        self.say(&format!("FAULT {kind} — {detail}"));
        history.fault(kind.as_str(), detail);
        if let Some(lasts) = lasts {
            self.active.push(Active {
                kind,
                host,
                until: Instant::now() + lasts,
            });
        }
    }

    fn direction(&mut self, both_allowed: bool) -> Direction {
        match self.rng.random_range(0..if both_allowed { 3 } else { 2 }) {
            0 => Direction::Up,
            1 => Direction::Down,
            _ => Direction::Both,
        }
    }

    fn cut(&mut self) -> Cut {
        if self.rng.random_bool(0.5) {
            Cut::Reset
        } else {
            Cut::Close
        }
    }
}
