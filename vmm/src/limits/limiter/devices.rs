//! The VM's limit of scope `vm` (issue 36): the device threads' CPU is charged to the VM's
//! budget, and once the budget is spent, after the vCPUs, the device threads are held.
//!
//! Data flow: at each look of such a limit the thread reads every device thread's CPU clock
//! (its `WorkerMeter`), charges what they used since the period began, and keeps for them the
//! part of last period's use that the rest of the period would see at last period's pace: the
//! vCPUs share what is left ([`Limiter::devices_budget`]). So a reserve the devices do not use
//! goes back to the vCPUs as the period runs out, and devices that run faster than last period
//! are kept more for. When the members and the devices together reach the quota
//! less the margin, each device thread is held ([`crate::accounting::worker::hold`]): it stops
//! serving its queues until the next period, which releases it ([`Limiter::devices_begin`]).
//! Device threads have no kick timer, so the thread looks again before the devices and the
//! running vCPUs together could spend what is left.

use std::sync::Arc;

use super::{Entity, LimitKind, Limiter};
use crate::accounting::worker::WorkerMeter;
use crate::devices::Device;
use crate::limits::engine::{Member, MIN_RECHECK_NS};
use crate::limits::{Limit, Scope};

/// While the vCPUs are at (or near) their budget and the devices have a reserve, the thread
/// looks again at least this many times a period, so that what the devices leave unused goes
/// back to the vCPUs within the period.
pub(super) const GIVE_BACK_LOOKS: u64 = 16;

/// A limit of scope `vm`'s account of the device threads.
#[derive(Debug, Default)]
pub(super) struct DeviceCharge {
    /// Each device thread's CPU clock at the period's start.
    base: Vec<u64>,
    /// What they are expected to use in a period: last period's. No headroom (at 10 % the VM
    /// got 47 % of a 50 % quota, at none 48.8-49.0 %: docs/limits.md "Scope"); devices that use
    /// more are held when the quota is spent, as before.
    expected: u64,
    /// Whether they are held now.
    held: bool,
    /// Their CPU in the completed periods.
    pub ns: u64,
    /// Their held time and holds when the limit was set.
    limited_base: u64,
    holds_base: u64,
}

/// Every device thread's meter.
fn meters(devices: &[Arc<dyn Device>]) -> impl Iterator<Item = &WorkerMeter> {
    devices.iter().flat_map(|d| d.worker_meters().iter())
}

impl Limiter {
    /// The VM's devices with threads of their own (set once, before the run).
    pub fn set_devices(&self, devices: Vec<Arc<dyn Device>>) {
        let _ = self.devices.set(devices);
    }

    fn devices(&self) -> &[Arc<dyn Device>] {
        self.devices.get().map_or(&[], |d| d.as_slice())
    }

    /// The devices' CPU since the period began.
    fn devices_used(&self, e: &Entity) -> u64 {
        meters(self.devices())
            .zip(e.dev.base.iter().chain(std::iter::repeat(&0)))
            .map(|(m, b)| m.times().used_ns.saturating_sub(*b))
            .sum()
    }

    /// A period begins: the devices' clocks as its base, and their hold ends.
    pub(super) fn devices_begin(&self, e: &mut Entity) {
        e.dev.base = meters(self.devices()).map(|m| m.times().used_ns).collect();
        if std::mem::take(&mut e.dev.held) {
            self.hold_devices(false);
        }
    }

    /// The limit was set: its device figures count from now.
    pub(super) fn devices_set(&self, e: &mut Entity) {
        e.dev.limited_base = meters(self.devices()).map(|m| m.hold.held_ns()).sum();
        e.dev.holds_base = meters(self.devices()).map(|m| m.hold.holds()).sum();
    }

    /// A period closed: what the devices used is charged, and expected again (no headroom).
    pub(super) fn devices_close(&self, e: &mut Entity) -> u64 {
        let used = self.devices_used(e);
        e.dev.ns += used;
        e.dev.expected = used;
        used
    }

    /// Holds (or releases) every device thread and wakes them to see it.
    pub(super) fn hold_devices(&self, hold: bool) {
        for m in meters(self.devices()) {
            if hold {
                m.hold.hold();
            } else {
                m.hold.release();
            }
        }
        for d in self.devices() {
            d.wake_threads();
        }
    }

    /// For a limit `l` of scope `vm`, its vCPUs `members` as read `now`: the budget left to
    /// the vCPUs (the quota less what the devices used this period and what they are expected
    /// to use in the rest of it, [`device_reserve`]), and when to look again for the devices'
    /// sake. Holds the devices once the budget is spent.
    pub(super) fn devices_budget(
        &self,
        e: &mut Entity,
        members: &[Member],
        l: &Limit,
        margin_ns: u64,
        now: u64,
    ) -> (u64, Option<u64>) {
        let quota_ns = l.quota_ns;
        let threads = meters(self.devices()).count() as u64;
        if threads == 0 {
            return (quota_ns, None);
        }
        let used = self.devices_used(e);
        let vcpus: u64 = members.iter().map(|m| m.used_ns).sum();
        let spent = used + vcpus + margin_ns >= quota_ns;
        if spent && !e.dev.held {
            e.dev.held = true;
            self.hold_devices(true);
        }
        let elapsed = now.saturating_sub(e.period_start);
        let rest = device_reserve(e.dev.expected, elapsed, l.period_ns);
        let budget = quota_ns.saturating_sub(used + rest);
        if e.dev.held {
            return (budget, None);
        }
        let running = members.iter().filter(|m| m.can_run && !m.stopped).count() as u64;
        let on_cpu = (threads + running).min(self.host_cpus.max(1) as u64);
        let left = quota_ns.saturating_sub(used + vcpus + on_cpu * margin_ns);
        let mut recheck = (left / on_cpu).max(MIN_RECHECK_NS);
        // A vCPU stopped (or about to be) at a budget that grows as the reserve runs out: look
        // again soon enough to release it.
        let at_budget = members.iter().any(|m| m.stopped) || vcpus + 4 * margin_ns >= budget;
        if rest > 0 && at_budget {
            recheck = recheck.min((l.period_ns / GIVE_BACK_LOOKS).max(MIN_RECHECK_NS));
        }
        (budget, Some(recheck))
    }

    /// The devices' figures for the limit's stats: CPU charged, held time and holds.
    pub(super) fn devices_figures(&self, e: &Entity) -> (u64, u64, u64) {
        let held: u64 = meters(self.devices()).map(|m| m.hold.held_ns()).sum();
        let holds: u64 = meters(self.devices()).map(|m| m.hold.holds()).sum();
        (
            e.dev.ns,
            held.saturating_sub(e.dev.limited_base),
            holds.saturating_sub(e.dev.holds_base),
        )
    }
}

/// What the devices are expected to use in the rest of a period of `period_ns`, `elapsed_ns`
/// into it, when they used `expected_ns` in the last one: that use at the same pace, pro rata.
pub(super) fn device_reserve(expected_ns: u64, elapsed_ns: u64, period_ns: u64) -> u64 {
    if period_ns == 0 {
        return 0;
    }
    let rest = period_ns.saturating_sub(elapsed_ns);
    (u128::from(expected_ns) * u128::from(rest) / u128::from(period_ns)) as u64
}

/// The scope of `e`'s limit, from its text (`50%,scope=vm`); a group's is always `vcpus`.
pub(super) fn scope_of(e: &Entity) -> Scope {
    match &e.limit {
        Some((_, text)) if e.kind == LimitKind::Vm => {
            crate::limits::parse_vm_limit(text).map_or(Scope::Vcpus, |(_, s)| s)
        }
        _ => Scope::Vcpus,
    }
}
