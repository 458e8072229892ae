//! `bench overhead`'s measure of what the accounting levels cost, in one VM: the level is
//! switched live every slice (off, basic, off, full without tracepoints, again and again), and
//! each level's exits per second is its exits over its slices' wall time.
//!
//! Why: a run of its own for each level is a VM of its own, minutes of host noise apart in
//! the worst case and a few hundred ms at best; on the 2-core development host a level's rate
//! moved 5 % from run to run (kernel part of the exit 51,000-59,000 cycles; the VMM's part
//! 1,500-3,000) and a round's basic/off spread over ±3 %, ten times the difference the
//! verdict tests. Slices of one VM a few ms apart see the same host: their rounds' basic/off
//! spread ±0.3 % on the same host (2026-11-30). The runs of their own stay for the rates and
//! off/raw, which a raw loop cannot share a VM with.
//!
//! The slices are timed on the bench's thread: the level is set, the vCPU takes it at its next
//! entry (an exit every ~20 µs), and after a settling pause the exit count is read at the
//! slice's start and end. A switch costs the vCPU one pass through the run loop, a few µs
//! in a slice of [`SLICE_MS`]. A first cycle is not counted: it takes what only the first
//! slices pay (the guest's start, the first switch to full opening the thread's context-switch
//! records). The cycles alternate between off, basic, off, full and off, full, off, basic, so
//! that neither level's slices sit on average later in the round than the other's (a host
//! whose rate drifts over the round would otherwise favour one). A round whose guest ended
//! before its slices did, or in which a level got no exits, is an error, not a figure.

use std::time::{Duration, Instant};

use serde::Serialize;

use ppa_vmm::accounting::Level;
use ppa_vmm::vm::VmError;

use super::socket::exits_so_far as exits;
use super::{vm_of, Place};

/// Length of one slice, ms.
pub const SLICE_MS: u64 = 25;
/// Counted cycles of four slices a round runs (after one that is not counted).
pub const CYCLES: usize = 8;
/// Pause after a level switch before its slice begins.
const SETTLE: Duration = Duration::from_millis(1);
/// The most a round waits for its vCPU's first exits.
const START_WAIT: Duration = Duration::from_secs(5);
/// The slices' levels, in order: even cycles, odd cycles.
const ORDERS: [[Level; 4]; 2] = [
    [Level::Off, Level::Basic, Level::Off, Level::Full],
    [Level::Off, Level::Full, Level::Off, Level::Basic],
];

/// One round: each level's exits per second over its slices.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Rates {
    /// Accounting off (two slices a cycle).
    pub off: f64,
    /// Basic.
    pub basic: f64,
    /// Full without the kernel's tracepoints.
    pub full_notrace: f64,
}

impl Rates {
    /// Rates from each slice's level, exits and wall ns; a level with no time reads 0.
    pub fn of(slices: &[(Level, u64, u64)]) -> Rates {
        let rate = |level: Level| {
            let (n, ns) = slices
                .iter()
                .filter(|s| s.0 == level)
                .fold((0u64, 0u64), |(n, ns), s| (n + s.1, ns + s.2));
            if ns == 0 {
                0.0
            } else {
                n as f64 * 1e9 / ns as f64
            }
        };
        Rates {
            off: rate(Level::Off),
            basic: rate(Level::Basic),
            full_notrace: rate(Level::Full),
        }
    }
}

/// Runs one round on a fresh one-vCPU VM placed as `place`, `exits_cap` exits at most (the VM
/// is shut down when the slices are done).
pub(crate) fn round(place: Place, exits_cap: u64) -> Result<Rates, VmError> {
    let vm = vm_of(
        format!("exits:n={exits_cap},kind=mmio"),
        Level::Off,
        false,
        place,
    )?;
    let h = vm.handle();
    let run = std::thread::spawn(move || vm.run());
    let t0 = Instant::now();
    while exits(&h) == 0 && t0.elapsed() < START_WAIT && !h.finished() {
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut slices = Vec::with_capacity((CYCLES + 1) * 4);
    for cycle in 0..=CYCLES {
        for level in ORDERS[cycle % 2] {
            h.set_level(level);
            std::thread::sleep(SETTLE);
            let (a, t) = (exits(&h), Instant::now());
            std::thread::sleep(Duration::from_millis(SLICE_MS));
            let (b, d) = (exits(&h), t.elapsed());
            if cycle > 0 {
                slices.push((level, b.saturating_sub(a), d.as_nanos() as u64));
            }
        }
    }
    let ended_early = h.finished();
    h.shutdown();
    run.join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))?;
    let rates = Rates::of(&slices);
    let why = if ended_early {
        Some("the guest ended before the slices did")
    } else if rates.off == 0.0 || rates.basic == 0.0 || rates.full_notrace == 0.0 {
        Some("a level's slices counted no exits")
    } else {
        None
    };
    match why {
        Some(why) => Err(VmError::Thread(
            "bench slices",
            std::io::Error::other(format!("{why}: {rates:?}")),
        )),
        None => Ok(rates),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_levels_rate_is_its_exits_over_its_slices_time() {
        let r = Rates::of(&[
            (Level::Off, 1_000, 20_000_000),
            (Level::Basic, 900, 20_000_000),
            (Level::Off, 1_100, 20_000_000),
            (Level::Full, 800, 10_000_000),
        ]);
        assert_eq!(r.off, 52_500.0);
        assert_eq!(r.basic, 45_000.0);
        assert_eq!(r.full_notrace, 80_000.0);
        assert_eq!(Rates::of(&[]), Rates::default());
    }
}
