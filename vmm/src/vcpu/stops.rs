//! What a vCPU's CPU limits cost it to stop and restart: its *stops* (issue 39), and the
//! CPU clock a limit charges it by (its thread CPU clock less its stops).
//!
//! Data flow. A stop begins where the run loop takes a limit's stop or a kick-timer firing:
//! after the spin of an exact stop (the spin lands the stop on its target, and is charged
//! like the guest's own time), at the decision of a firing that re-arms, or at the loop's
//! turn that finds a limit's request. It ends at the next entry into the guest (or at the
//! thread's end). The vCPU thread, the one writer, measures what lies between with its CPU
//! clock (the park path, the futex wait and wake-up, the paravirtual clock's notice, the
//! timer's re-arming) and adds KVM's part: for a stop that began after an exit the kick forced
//! (`intr`), the round trip that exit and the entry after it cost; for one that parked
//! without, what the entry after the park costs beyond a warm one. An **estimate**: the VM's
//! measured round trips (after a park, the cold one of a park that long:
//! `hypervisor::ExitCost::after_park_of`), since KVM's part happens inside KVM_RUN where the
//! VMM's clocks cannot split it on every host.
//! [`StopAccount`] keeps the totals and the stop in progress behind a sequence counter;
//! readers ([`StopAccount::charged`]) take the thread's CPU clock inside one consistent read,
//! so a stop in progress never counts towards the charge. The limiter (`limits::limiter`)
//! holds each limit's members to their quota by this charged clock, and the CPU of their stops
//! goes to the VMM's own account (docs/limits.md, "What a stop costs, and who pays it").

use std::sync::atomic::{fence, AtomicU64, Ordering};

use crate::hypervisor::ExitCost;

/// The totals of a vCPU's stops, as one consistent read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StopTotals {
    /// Stops ended (or in progress).
    pub stops: u64,
    /// Their CPU outside KVM_RUN, measured by the thread's CPU clock.
    pub cpu_ns: u64,
    /// Their KVM round trips, estimated from the VM's measured exit cost.
    pub kvm_estimate_ns: u64,
}

impl StopTotals {
    /// Both parts together: what the limits do not charge.
    pub fn total_ns(&self) -> u64 {
        self.cpu_ns + self.kvm_estimate_ns
    }
}

/// The KVM round trip a stop added. With an exit forced for it (a kick's `intr`): the cold
/// round trip after a park of that length when it parked (`parked`: the park's wall time,
/// ns), else the hot one. Without (the vCPU was parked or outside the guest when the stop
/// began): what the entry after its park costs beyond a warm one (the cold round trip less the
/// hot), and nothing when it did not park. An estimate (the calibration's medians,
/// [`ExitCost::after_park_of`]), 0 where the VM has no exit cost.
pub fn kvm_round_trip(cost: Option<ExitCost>, forced_exit: bool, parked: Option<u64>) -> u64 {
    match (cost, forced_exit, parked) {
        (Some(c), true, Some(park_ns)) => c.after_park_of(park_ns),
        (Some(c), true, None) => c.hot_ns,
        (Some(c), false, Some(park_ns)) => c.after_park_of(park_ns).saturating_sub(c.hot_ns),
        _ => 0,
    }
}

/// The CPU clock a limit charges by: `cpu_ns` (the thread's CPU clock) less the stops' totals,
/// and, while a stop is in progress (`open_from`: the CPU clock when it began), frozen there.
pub fn charged(cpu_ns: u64, open_from: Option<u64>, totals: &StopTotals) -> u64 {
    let at = open_from.map_or(cpu_ns, |o| o.min(cpu_ns));
    at.saturating_sub(totals.total_ns())
}

/// A vCPU's stops: written by its thread (one writer), read by the limiter and the reports.
#[derive(Debug, Default)]
pub struct StopAccount {
    seq: AtomicU64,
    /// The CPU clock when the stop in progress began; 0: none.
    open_from: AtomicU64,
    stops: AtomicU64,
    cpu_ns: AtomicU64,
    kvm_estimate_ns: AtomicU64,
}

impl StopAccount {
    fn write(&self, f: impl FnOnce()) {
        let s = self.seq.load(Ordering::Relaxed);
        self.seq.store(s.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        f();
        self.seq.store(s.wrapping_add(2), Ordering::Release);
    }

    /// A stop begins with the thread's CPU clock at `cpu_ns` (vCPU thread); nothing if one is
    /// in progress. True when it began.
    pub fn begin(&self, cpu_ns: u64) -> bool {
        if self.open_from.load(Ordering::Relaxed) != 0 {
            return false;
        }
        self.write(|| {
            self.open_from.store(cpu_ns.max(1), Ordering::Relaxed);
            self.stops
                .store(self.stops.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        });
        true
    }

    /// Whether a stop is in progress (vCPU thread).
    pub fn is_open(&self) -> bool {
        self.open_from.load(Ordering::Relaxed) != 0
    }

    /// Stops begun so far (vCPU thread: the writer's own view).
    pub fn count(&self) -> u64 {
        self.stops.load(Ordering::Relaxed)
    }

    /// The stop in progress ends with the CPU clock at `cpu_ns` and `kvm_ns` of estimated KVM
    /// round trip (vCPU thread); the totals that the limits do not charge, after it.
    pub fn end(&self, cpu_ns: u64, kvm_ns: u64) -> StopTotals {
        let from = self.open_from.load(Ordering::Relaxed);
        if from != 0 {
            self.write(|| {
                let cpu = self.cpu_ns.load(Ordering::Relaxed) + cpu_ns.saturating_sub(from);
                self.cpu_ns.store(cpu, Ordering::Relaxed);
                let est = self.kvm_estimate_ns.load(Ordering::Relaxed) + kvm_ns;
                self.kvm_estimate_ns.store(est, Ordering::Relaxed);
                self.open_from.store(0, Ordering::Relaxed);
            });
        }
        self.read(|| 0).1
    }

    /// One consistent read: the stop in progress (its CPU clock at the start), the totals (a
    /// stop in progress counted up to `cpu()`'s value) and what `cpu()` read, taken inside
    /// the read so that a stop that begins meanwhile is seen. Bounded: after 64 tries the last
    /// reading stands.
    fn read(&self, cpu: impl Fn() -> u64) -> (Option<u64>, StopTotals, u64) {
        let mut last = (None, StopTotals::default(), 0);
        for _ in 0..64 {
            let s1 = self.seq.load(Ordering::Acquire);
            let open = self.open_from.load(Ordering::Relaxed);
            let totals = StopTotals {
                stops: self.stops.load(Ordering::Relaxed),
                cpu_ns: self.cpu_ns.load(Ordering::Relaxed),
                kvm_estimate_ns: self.kvm_estimate_ns.load(Ordering::Relaxed),
            };
            let c = cpu();
            fence(Ordering::Acquire);
            last = ((open != 0).then_some(open), totals, c);
            if s1 % 2 == 0 && self.seq.load(Ordering::Relaxed) == s1 {
                break;
            }
            std::hint::spin_loop();
        }
        last
    }

    /// The charged CPU clock now, from the thread CPU clock `cpu()` (read inside), and the
    /// totals with a stop in progress counted up to that reading.
    pub fn charged(&self, cpu: impl Fn() -> u64) -> (u64, StopTotals) {
        let (open, mut totals, c) = self.read(cpu);
        let charged = charged(c, open, &totals);
        if let Some(o) = open {
            totals.cpu_ns += c.saturating_sub(o);
        }
        (charged, totals)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const COST: ExitCost = ExitCost {
        hot_ns: 20_000,
        after_park_ns: 27_000,
        after_long_park_ns: 75_000,
    };

    #[test]
    fn the_round_trip_counts_a_forced_exit_and_a_cold_entry_after_a_park() {
        assert_eq!(kvm_round_trip(Some(COST), true, Some(100_000)), 27_000);
        assert_eq!(kvm_round_trip(Some(COST), true, Some(9_000_000)), 75_000);
        assert_eq!(kvm_round_trip(Some(COST), true, None), 20_000);
        // A park without a forced exit: the cold entry's cost beyond a warm one.
        assert_eq!(kvm_round_trip(Some(COST), false, Some(9_000_000)), 55_000);
        assert_eq!(kvm_round_trip(Some(COST), false, None), 0);
        assert_eq!(kvm_round_trip(None, true, Some(100_000)), 0);
    }

    #[test]
    fn the_round_trip_after_a_park_grows_with_the_park_between_the_two_measured() {
        // 27 µs up to 200 µs, 75 µs from 8 ms on, the line between: half-way at 4.1 ms.
        assert_eq!(COST.after_park_of(0), 27_000);
        assert_eq!(COST.after_park_of(200_000), 27_000);
        assert_eq!(COST.after_park_of(4_100_000), 51_000);
        assert_eq!(COST.after_park_of(8_000_000), 75_000);
        assert_eq!(COST.after_park_of(u64::MAX), 75_000);
        // A long park measured below the short one (noise): never below the short one.
        let odd = ExitCost {
            after_long_park_ns: 10_000,
            ..COST
        };
        assert_eq!(odd.after_park_of(8_000_000), 27_000);
    }

    #[test]
    fn a_stop_in_progress_freezes_the_charge() {
        let a = StopAccount::default();
        assert_eq!(a.charged(|| 1_000_000).0, 1_000_000, "no stop yet");
        assert!(a.begin(1_000_000));
        assert!(!a.begin(1_100_000), "one stop at a time");
        // The park path, the wait and the wake-up use 40 µs: not charged.
        let (c, t) = a.charged(|| 1_040_000);
        assert_eq!(c, 1_000_000);
        assert_eq!((t.stops, t.cpu_ns), (1, 40_000));
        let t = a.end(1_050_000, 27_000);
        assert_eq!(t.total_ns(), 77_000);
        // The guest runs 200 µs more: charged from where the stop left it, less the round trip.
        let (c, t) = a.charged(|| 1_250_000);
        assert_eq!(c, 1_250_000 - 77_000);
        assert_eq!((t.stops, t.cpu_ns, t.kvm_estimate_ns), (1, 50_000, 27_000));
        assert_eq!(a.end(1_300_000, 5), t, "no stop in progress: nothing ends");
    }

    #[test]
    fn charged_is_frozen_at_the_start_of_the_stop_in_progress() {
        let t = StopTotals {
            stops: 2,
            cpu_ns: 30,
            kvm_estimate_ns: 20,
        };
        assert_eq!(charged(1_000, None, &t), 950);
        assert_eq!(charged(1_000, Some(600), &t), 550);
        assert_eq!(
            charged(500, Some(600), &t),
            450,
            "a clock read before the start"
        );
        assert_eq!(charged(10, None, &t), 0);
    }
}
