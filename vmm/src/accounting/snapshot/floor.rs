//! Live figures that never go down between resets (spec section 4): each vCPU keeps the last
//! time split a reader returned (its floor), and every live read is held at or above it
//! before it leaves (`stats`, metrics, the PPA page's host records, `top`).
//!
//! Why a read can come out lower than the one before it: outside level full with records a
//! live read cannot see the off-CPU episode in progress. schedstat's run_delay counts a
//! run-queue wait and KVM's `halt_wait_ns` a halt only when they end, so until then that time
//! is in the residual (blocked), and when it ends it moves to steal or halted and blocked
//! drops by as much (tens of ms with more vCPUs than CPUs); an estimated guest/vmm split may
//! move a little time between the two; and a read taken between the vCPU thread's final
//! readings and their publication is a few microseconds ahead of the final figures. Data
//! flow: when the residual grew since the last read, [`hint`] says where its growth is going
//! (halted for a vCPU blocked in KVM, by KVM's `blocking` statistic; steal for a thread that
//! is runnable now, by its /proc state: off its CPU and runnable is waiting for one); [`hold`]
//! routes that growth there, then holds every part at or above the floor while keeping the
//! sums the sample had. A hold that
//! guessed wrong is taken back as soon as the parts that kept it grow again; until then the
//! error is at most the in-progress time it held. Pure functions, unit-tested in
//! `tests.rs`.

use ppa_vmm_api::TimeSplit;

use super::super::meter::MicroState;
use super::RawSample;

/// Where the residual's growth during the KVM_RUN in progress is going.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Pending {
    /// Runnable and waiting for a CPU (run_delay counts it when it ends).
    Steal,
    /// Blocked in KVM, a halt (halt_wait_ns counts it when it ends).
    Halted,
}

/// What a live read knows of the time in progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Hint {
    /// Where the growth is going.
    pub(super) pending: Pending,
    /// Start of the KVM_RUN in progress (CLOCK_MONOTONIC): growth before it is not this one's.
    pub(super) since_ns: u64,
}

/// The last split a reader returned for a vCPU.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Floor {
    /// The reset epoch it belongs to (a reset restarts every figure from zero).
    pub(super) epoch: u64,
    /// The split returned.
    pub(super) time: TimeSplit,
}

/// Where the residual of a live sample is going, when the sample can tell: the vCPU thread is
/// in KVM_RUN or handling an exit (not parked: parks are measured) and its records did not see
/// the interval in progress. Blocked in KVM (its `blocking` statistic) inside KVM_RUN: a halt;
/// otherwise `runnable` (the thread's state now) says whether it waits for a CPU. None
/// otherwise (a final sample, a park, records that saw it, a thread asleep in the kernel or
/// whose state cannot be read: the residual stays blocked).
/// `blocking` is the sample's KVM `blocking` statistic (None without it).
pub(super) fn hint(
    cur: &RawSample,
    blocking: Option<u64>,
    runnable: impl FnOnce() -> Option<bool>,
) -> Option<Hint> {
    let m = &cur.meter;
    let state = m.micro_state();
    if !cur.live || m.since == 0 || state.park_kind().is_some() {
        return None;
    }
    if m.records_on && cur.on_cpu_complete {
        return None;
    }
    // The micro-state the reading shows may have begun after the clocks were read (the
    // thread moved on meanwhile); the one in progress as the sample began holds what the
    // clocks did not yet count.
    let since_ns = match cur.began_in_ns {
        0 => m.since,
        b => b.min(m.since),
    };
    let hint = |pending| Some(Hint { pending, since_ns });
    if state == MicroState::Guest && blocking.is_some_and(|b| b != 0) {
        return hint(Pending::Halted);
    }
    match runnable() {
        Some(true) => hint(Pending::Steal),
        _ => None,
    }
}

/// `cur` held at or above `prev` part by part: each part is at least its `prev` value, the sum
/// is `target` (or `prev`'s sum when that is larger), and the parts stay as close to `cur` as
/// that allows. Parts that must give back what the hold added give in `give` order (the least
/// certain first); a shortfall goes to the first of them.
fn fill<const N: usize>(prev: [u64; N], cur: [u64; N], target: u64, give: [usize; N]) -> [u64; N] {
    let mut r: [u64; N] = std::array::from_fn(|i| prev[i].max(cur[i]));
    let sum: u64 = r.iter().sum();
    if sum > target {
        let mut excess = sum - target;
        for i in give {
            let d = (r[i] - prev[i]).min(excess);
            r[i] -= d;
            excess -= d;
        }
    } else {
        r[give[0]] += target - sum;
    }
    r
}

/// `cur`, a split sampled at `at_ns`, held at or above `floor` (see the module comment).
pub(super) fn hold(floor: &Floor, cur: TimeSplit, at_ns: u64, hint: Option<Hint>) -> TimeSplit {
    let p = floor.time;
    let mut r = cur;
    // The clocks the kernel and the VMM keep only grow; a sample older than the floor (a
    // final one taken just before a live read, or a reader that lost a race) is held up.
    r.wall_ns = p.wall_ns.max(cur.wall_ns);
    r.used_ns = p.used_ns.max(cur.used_ns);
    r.idle_ns = p.idle_ns.max(cur.idle_ns);
    r.limited_ns = p.limited_ns.max(cur.limited_ns);
    r.paused_ns = p.paused_ns.max(cur.paused_ns);
    // guest + kvm + interrupted + vmm = used; guest is the remainder of the split, so it
    // gives first.
    [r.guest_ns, r.kvm_ns, r.interrupted_ns, r.vmm_ns] = fill(
        [p.guest_ns, p.kvm_ns, p.interrupted_ns, p.vmm_ns],
        [cur.guest_ns, cur.kvm_ns, cur.interrupted_ns, cur.vmm_ns],
        r.used_ns,
        [0, 1, 2, 3],
    );
    // steal + halted + blocked: the residual's growth during the KVM_RUN in progress goes
    // where the hint says; blocked (a remainder) gives first, then halted (an upper bound),
    // then steal (the kernel's count).
    let mut x = [cur.steal_ns, cur.halted_ns, cur.blocked_ns];
    if let Some(h) = hint {
        // What blocked gained over the floor is the time in progress (including what earlier
        // reads already routed: it stays in the sample's residual until the episode ends),
        // and whatever ended since the floor: only the KVM_RUN or exit handling in progress
        // can hold the former.
        let g = x[2]
            .saturating_sub(p.blocked_ns)
            .min(at_ns.saturating_sub(h.since_ns));
        x[2] -= g;
        x[match h.pending {
            Pending::Steal => 0,
            Pending::Halted => 1,
        }] += g;
    }
    // The sum the sample had, plus what holding the clocks added to wall beyond used and the
    // parks (so an identity error the sample shows, at level full, is kept, not hidden).
    let added = |held: u64, sampled: u64| held - sampled;
    let target = (x.iter().sum::<u64>() + added(r.wall_ns, cur.wall_ns)).saturating_sub(
        added(r.used_ns, cur.used_ns)
            + added(r.idle_ns, cur.idle_ns)
            + added(r.limited_ns, cur.limited_ns)
            + added(r.paused_ns, cur.paused_ns),
    );
    [r.steal_ns, r.halted_ns, r.blocked_ns] = fill(
        [p.steal_ns, p.halted_ns, p.blocked_ns],
        x,
        target,
        [2, 1, 0],
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    /// A split with used = guest + vmm (vmm 0) and no parks.
    fn split(wall: u64, used: u64, steal: u64, halted: u64, blocked: u64) -> TimeSplit {
        TimeSplit {
            wall_ns: wall * MS,
            used_ns: used * MS,
            guest_ns: used * MS,
            steal_ns: steal * MS,
            halted_ns: halted * MS,
            blocked_ns: blocked * MS,
            ..TimeSplit::default()
        }
    }

    fn floor(time: TimeSplit) -> Floor {
        Floor { epoch: 0, time }
    }

    fn steal_since(ms: u64) -> Option<Hint> {
        Some(Hint {
            pending: Pending::Steal,
            since_ns: ms * MS,
        })
    }

    fn went_down(a: &TimeSplit, b: &TimeSplit) -> bool {
        a.values().iter().zip(b.values()).any(|(x, y)| y < *x)
    }

    #[test]
    fn a_wait_in_progress_is_steal_before_run_delay_counts_it() {
        // Busy in one KVM_RUN since 1 ms; at 10 ms it has waited for a CPU since 8 ms, which
        // run_delay does not count yet: the sample's residual (blocked) holds it.
        let zero = floor(TimeSplit::default());
        let c1 = split(10, 6, 2, 0, 2);
        let r1 = hold(&zero, c1, 10 * MS, steal_since(1));
        assert_eq!(r1, split(10, 6, 4, 0, 0));
        // The wait ended at 11 ms and the thread ran to 12: the kernel's count catches up.
        let c2 = split(12, 7, 5, 0, 0);
        let r2 = hold(&floor(r1), c2, 12 * MS, None);
        assert_eq!(r2, c2, "exact once the kernel counted it");
        // Without the hint the same reads would have shown blocked going down: the hold keeps
        // it and steal gives back what blocked kept (a wait held as blocked until blocked
        // grows again), and nothing goes down.
        let r1 = hold(&zero, c1, 10 * MS, None);
        let r2 = hold(&floor(r1), c2, 12 * MS, None);
        assert_eq!(r2, split(12, 7, 3, 0, 2));
        assert!(!went_down(&r1, &r2));
        let c3 = split(20, 10, 5, 0, 5);
        assert_eq!(hold(&floor(r2), c3, 20 * MS, None), c3, "taken back");
    }

    #[test]
    fn only_the_time_in_progress_is_routed() {
        // 3 ms blocked in exit handling that ended before the KVM_RUN in progress began at
        // 9 ms, then 1 ms of waiting for a CPU: only the last millisecond can be the wait.
        let c = split(10, 5, 1, 0, 4);
        let r = hold(&floor(split(5, 4, 1, 0, 0)), c, 10 * MS, steal_since(9));
        assert_eq!(r, split(10, 5, 2, 0, 3));
    }

    #[test]
    fn a_halt_in_progress_is_halted() {
        let c1 = split(10, 2, 0, 3, 5);
        let h = Some(Hint {
            pending: Pending::Halted,
            since_ns: 4 * MS,
        });
        let r1 = hold(&floor(split(4, 2, 0, 0, 0)), c1, 10 * MS, h);
        assert_eq!(r1, split(10, 2, 0, 8, 0));
        // The halt ended: halt_wait_ns counts it.
        let c2 = split(11, 2, 0, 9, 0);
        assert_eq!(hold(&floor(r1), c2, 11 * MS, None), c2);
    }

    #[test]
    fn an_estimated_split_that_moves_time_back_is_held() {
        let p = TimeSplit {
            guest_ns: 5 * MS,
            vmm_ns: MS,
            ..split(6, 6, 0, 0, 0)
        };
        // 0.5 ms more used, of which the estimate now puts 0.5 ms less in vmm.
        let c = TimeSplit {
            guest_ns: 6 * MS,
            vmm_ns: MS / 2,
            used_ns: 6 * MS + MS / 2,
            blocked_ns: MS / 2,
            ..split(7, 0, 0, 0, 0)
        };
        let r = hold(&floor(p), c, 7 * MS, None);
        assert_eq!((r.guest_ns, r.vmm_ns), (5 * MS + MS / 2, MS));
        assert_eq!(r.used_ns, c.used_ns);
        assert_eq!(r.identity_error_ns(), c.identity_error_ns());
    }

    #[test]
    fn a_sample_older_than_the_floor_is_held_up_whole() {
        // A final sample taken just before a live read that came out first.
        let p = split(100, 60, 20, 0, 20);
        let c = split(99, 59, 20, 0, 20);
        let r = hold(&floor(p), c, 99 * MS, None);
        assert!(!went_down(&p, &r));
        assert_eq!(r.identity_error_ns(), 0);
        assert_eq!(r, p);
    }

    #[test]
    fn an_identity_error_of_the_sample_is_kept() {
        // Level full: the records' on-CPU time disagrees with the clock by 1 ms.
        let c = split(10, 5, 2, 0, 2);
        assert_eq!(c.identity_error_ns(), MS as i64);
        let r = hold(&floor(split(5, 3, 1, 0, 1)), c, 10 * MS, None);
        assert_eq!(r, c);
        let r = hold(&floor(split(5, 3, 1, 0, 3)), c, 10 * MS, None);
        assert_eq!(
            r.identity_error_ns(),
            MS as i64,
            "held blocked, steal gives"
        );
        assert_eq!((r.steal_ns, r.blocked_ns), (MS, 3 * MS));
    }

    #[test]
    fn fill_gives_in_order_and_never_below_the_floor() {
        assert_eq!(fill([1, 1, 1], [3, 0, 3], 6, [2, 1, 0]), [3, 1, 2]);
        assert_eq!(
            fill([1, 1, 1], [3, 0, 3], 2, [2, 1, 0]),
            [1, 1, 1],
            "floor wins"
        );
        assert_eq!(
            fill([1, 1, 1], [1, 1, 1], 5, [2, 1, 0]),
            [1, 1, 3],
            "shortfall"
        );
        assert_eq!(
            fill([0, 0], [u64::MAX / 2, 0], u64::MAX / 2, [0, 1]),
            [u64::MAX / 2, 0]
        );
    }
}
