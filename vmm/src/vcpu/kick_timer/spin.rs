//! The spin that lands a limit's stop on its CPU target: how long it may be ([`spin_cap`]),
//! the charged clock it is measured on ([`charged_now`]) and the spin itself ([`spin_to`]).

use std::sync::atomic::Ordering;

use super::SPIN_WALL_MAX_NS;
use crate::accounting::host::thread_cpu_ns;
use crate::sync::now_ns;
use crate::vcpu::VcpuShared;

/// The spin of a stop is at most the CPU left to its target when the vCPU read its deadlines,
/// divided by this: 5 %.
pub const SPIN_SHARE_DIVISOR: u64 = 20;

/// The most a vCPU may spin for deadlines whose nearest CPU target is `target`, read with its
/// charged CPU clock from `cpu`: a twentieth of the CPU left to it (no cap without a target).
/// The spin is charged to the limit like the guest's own time (it is what lands the stop on
/// its target), so it is kept to 5 % of a member's share: a share of 250 µs (1 ms per period
/// among 4 busy vCPUs) gave the guest 35-40 % of it when the spin could take half (issue 39).
/// A share longer than 20 leads (about 1.5 ms here) is spun to exactly; a shorter one stops as
/// exactly as its timer's latency allows past the lead, and the limiter's margin takes the
/// median of that out of the next periods.
pub fn spin_cap(target: Option<u64>, cpu: impl FnOnce() -> u64) -> u64 {
    target.map_or(u64::MAX, |t| t.saturating_sub(cpu()) / SPIN_SHARE_DIVISOR)
}

/// The charged CPU clock now and the thread's own CPU clock it was read from (vCPU thread).
pub(super) fn charged_now(shared: &VcpuShared) -> (u64, u64) {
    let raw = thread_cpu_ns();
    (shared.stops.charged(|| raw).0, raw)
}

/// Spins in user space until the thread's CPU clock reaches `target` (from `cpu`, read last),
/// and returns the clock then; None when the limiter published since `epoch` or a request is
/// waiting (the loop looks again). The spin is at most the lead of CPU ([`super::on_fire`]), VMM
/// time in the accounting; after [`SPIN_WALL_MAX_NS`] of wall time it stops where it is.
pub(super) fn spin_to(shared: &VcpuShared, target: u64, mut cpu: u64, epoch: u64) -> Option<u64> {
    let t = &shared.kick_timer;
    let give_up = now_ns().saturating_add(SPIN_WALL_MAX_NS);
    while cpu < target {
        if t.epoch.load(Ordering::Acquire) != epoch || !shared.requests.load().is_empty() {
            return None;
        }
        if now_ns() > give_up {
            break;
        }
        std::hint::spin_loop();
        cpu = thread_cpu_ns();
    }
    Some(cpu)
}
