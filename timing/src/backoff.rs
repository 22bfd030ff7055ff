//! The one exponential backoff between retries. Owns the arithmetic of a wait — the first step,
//! doubled per retry up to a cap, optionally jittered between half and all of the step — and
//! the one draw of jitter ([`jitter_fraction`]). [`Backoff`] and [`Retries`] are pure values:
//! they never sleep, never read a clock and never draw randomness unless asked through
//! [`Backoff::wait`] or [`Retries::next_wait`].

use std::time::Duration;

/// How long to wait before each retry: `initial` before the first, doubled before each further
/// one, never more than `max`. With jitter, each wait is a uniform pick between half and all of
/// that step, so clients that failed together do not retry together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    jitter: bool,
}

impl Backoff {
    /// Doubling from `initial` up to `max`, without jitter. An `initial` above `max` waits `max`.
    pub const fn new(initial: Duration, max: Duration) -> Backoff {
        Backoff {
            initial,
            max,
            jitter: false,
        }
    }

    /// The same steps, each jittered to between half and all of itself.
    pub const fn with_jitter(self) -> Backoff {
        Backoff {
            jitter: true,
            ..self
        }
    }

    /// The first step.
    pub const fn initial(&self) -> Duration {
        self.initial
    }

    /// The cap.
    pub const fn max(&self) -> Duration {
        self.max
    }

    /// Whether the waits are jittered.
    pub const fn is_jittered(&self) -> bool {
        self.jitter
    }

    /// The step before retry `attempt` (counted from 0): `initial` doubled `attempt` times,
    /// capped at `max`. Exact for every `attempt`: the doubling stops at the cap, it never
    /// overflows.
    pub fn step(&self, attempt: u32) -> Duration {
        let mut step = self.initial;
        for _ in 0..attempt {
            if step >= self.max || step.is_zero() {
                break;
            }
            step = step.saturating_mul(2);
        }
        step.min(self.max)
    }

    /// The wait before retry `attempt`, given a jitter draw `fraction` in `[0, 1)`: the step
    /// itself without jitter; with jitter, `step × (½ + ½ × fraction)`.
    pub fn wait_with(&self, attempt: u32, fraction: f64) -> Duration {
        let step = self.step(attempt);
        if !self.jitter {
            return step;
        }
        let fraction = if fraction.is_finite() {
            fraction.clamp(0.0, 1.0)
        } else {
            0.0
        };
        // As `Duration::mul_f64`, without its panic where a step near `Duration::MAX` rounds
        // above it.
        Duration::try_from_secs_f64((0.5 + 0.5 * fraction) * step.as_secs_f64()).unwrap_or(step)
    }

    /// The wait before retry `attempt`, jitter (if any) drawn from [`jitter_fraction`].
    pub fn wait(&self, attempt: u32) -> Duration {
        if self.jitter {
            self.wait_with(attempt, jitter_fraction())
        } else {
            self.step(attempt)
        }
    }

    /// A counter of retries over these steps, at the first.
    pub const fn retries(self) -> Retries {
        Retries {
            backoff: self,
            taken: 0,
        }
    }
}

/// A retry loop's place in a [`Backoff`]: each [`Retries::next_wait`] is the wait before the
/// next retry and counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retries {
    backoff: Backoff,
    taken: u32,
}

impl Retries {
    /// The wait before the next retry (jittered if the backoff is); the one after it is a step
    /// further.
    pub fn next_wait(&mut self) -> Duration {
        let wait = self.backoff.wait(self.taken);
        self.taken = self.taken.saturating_add(1);
        wait
    }

    /// The step [`Retries::next_wait`] will jitter (or return as is) next.
    pub fn next_step(&self) -> Duration {
        self.backoff.step(self.taken)
    }

    /// How many waits were taken since the start or the last [`Retries::reset`].
    pub fn taken(&self) -> u32 {
        self.taken
    }

    /// Back to the first step (after a success).
    pub fn reset(&mut self) {
        self.taken = 0;
    }
}

/// A number in `[0, 1)`, different on every call: enough to spread retries, not for anything
/// secret. Each call hashes with fresh keys of the standard library's randomly seeded hasher.
pub fn jitter_fraction() -> f64 {
    use std::collections::hash_map::RandomState;
    use std::hash::{BuildHasher, Hasher};
    let bits = RandomState::new().build_hasher().finish();
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn each_step_doubles_the_last_up_to_the_cap_and_stays_there() {
        let b = Backoff::new(100 * MS, 1000 * MS);
        let steps: Vec<u64> = (0..7).map(|a| b.step(a).as_millis() as u64).collect();
        assert_eq!(steps, [100, 200, 400, 800, 1000, 1000, 1000]);
        assert_eq!(b.step(u32::MAX), 1000 * MS);
    }

    #[test]
    fn without_jitter_the_wait_is_the_step_whatever_the_draw() {
        let b = Backoff::new(500 * MS, 30 * 1000 * MS);
        for attempt in [0, 1, 5, 40] {
            assert_eq!(b.wait(attempt), b.step(attempt));
            assert_eq!(b.wait_with(attempt, 0.0), b.step(attempt));
            assert_eq!(b.wait_with(attempt, 0.99), b.step(attempt));
        }
    }

    #[test]
    fn a_jittered_wait_lies_between_half_and_all_of_its_step() {
        let b = Backoff::new(100 * MS, 1000 * MS).with_jitter();
        assert_eq!(b.wait_with(2, 0.0), 200 * MS);
        assert_eq!(b.wait_with(2, 0.5), 300 * MS);
        assert!(b.wait_with(2, 0.999_999) <= 400 * MS);
        for attempt in [0, 1, 2, 3, 4, 40] {
            let step = b.step(attempt);
            for _ in 0..50 {
                let wait = b.wait(attempt);
                assert!(wait >= step / 2 && wait <= step, "{attempt}: {wait:?}");
            }
        }
    }

    #[test]
    fn the_cap_holds_from_the_first_step_and_extreme_steps_never_overflow() {
        assert_eq!(Backoff::new(5 * MS, 2 * MS).step(0), 2 * MS);
        assert_eq!(
            Backoff::new(Duration::ZERO, MS).step(u32::MAX),
            Duration::ZERO
        );
        let huge = Backoff::new(Duration::from_nanos(1), Duration::MAX);
        assert_eq!(huge.step(10), Duration::from_nanos(1024));
        assert_eq!(huge.step(u32::MAX), Duration::MAX);
        assert!(huge.with_jitter().wait_with(u32::MAX, 1.0) <= Duration::MAX);
        assert_eq!(
            Backoff::new(MS, MS).with_jitter().wait_with(0, f64::NAN),
            MS / 2
        );
    }

    #[test]
    fn retries_walk_the_steps_and_a_reset_starts_over() {
        let mut r = Backoff::new(50 * MS, 2000 * MS).retries();
        let waits: Vec<u64> = (0..8).map(|_| r.next_wait().as_millis() as u64).collect();
        assert_eq!(waits, [50, 100, 200, 400, 800, 1600, 2000, 2000]);
        assert_eq!(r.taken(), 8);
        r.reset();
        assert_eq!(r.taken(), 0);
        assert_eq!(r.next_step(), 50 * MS);
        assert_eq!(r.next_wait(), 50 * MS);
    }

    #[test]
    fn the_jitter_draw_is_a_fraction_that_varies() {
        let draws: Vec<f64> = (0..100).map(|_| jitter_fraction()).collect();
        assert!(draws.iter().all(|f| (0.0..1.0).contains(f)));
        assert!(draws.windows(2).any(|w| w[0] != w[1]));
    }
}
