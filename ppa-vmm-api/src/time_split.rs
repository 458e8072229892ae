//! [`TimeSplit`]: where a vCPU thread's wall time went (spec section 4), as one value, and the
//! identity that ties its parts together.
//!
//! The wire structs ([`crate::VcpuTimes`], [`crate::VcpuSummary`]) keep these fields flat
//! and give them to code as a [`TimeSplit`] through `split()`. They are not a
//! `#[serde(flatten)]` member, for two reasons. The JSON must stay byte for byte what it was,
//! and in both structs other fields sit between the times (`kvm_ns`, the estimates and `parks`
//! after `guest_ns`), so a flattened member would reorder the keys. And serde documents
//! `flatten` as unsupported together with `deny_unknown_fields`, which every response type
//! uses: tried with serde 1.0.229, unknown keys were still refused with both attributes, but
//! only because flatten buffers the whole object first (slower for a client polling `stats`),
//! and the documentation promises nothing.

use serde::{Deserialize, Serialize};

/// The time split of one vCPU: wall time and the parts the identity of spec section 4 adds up
/// (definitions in docs/accounting.md). All in nanoseconds.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(deny_unknown_fields)]
pub struct TimeSplit {
    /// The identity's left-hand side: CLOCK_MONOTONIC since the thread started or was reset.
    pub wall_ns: u64,
    /// The thread's CPU clock; guest_ns + kvm_ns + interrupted_ns + vmm_ns.
    pub used_ns: u64,
    /// The part of used_ns inside KVM_RUN: guest code, and KVM's exit handling and host
    /// interrupts where those are not measured apart.
    pub guest_ns: u64,
    /// The part of used_ns inside KVM_RUN in KVM's exit handling, where KVM's tracepoints
    /// measure it (0 where they do not: the wire's `kvm_ns` is then null).
    pub kvm_ns: u64,
    /// The part of used_ns in host interrupts while the thread was current, where the
    /// interrupt tracepoints measure it (0 where not: the wire's `interrupted_ns` is null).
    pub interrupted_ns: u64,
    /// The part of used_ns outside KVM_RUN.
    pub vmm_ns: u64,
    /// Runnable but not running (schedstat run_delay).
    pub steal_ns: u64,
    /// Blocked in KVM_RUN by the guest's HLT.
    pub halted_ns: u64,
    /// Parked at the guest's request.
    pub idle_ns: u64,
    /// Parked by a CPU limit.
    pub limited_ns: u64,
    /// Parked by an operator's pause.
    pub paused_ns: u64,
    /// Off CPU and not runnable outside any park and not halted: asleep in the kernel inside
    /// KVM_RUN or while handling an exit (e.g. on a lock).
    pub blocked_ns: u64,
}

impl TimeSplit {
    /// The parts' names, in the order of [`TimeSplit::values`] (the field names without
    /// `_ns`; the metrics call them `ppa_vcpu_NAME_seconds_total`).
    pub const NAMES: [&'static str; 12] = [
        "wall",
        "used",
        "guest",
        "kvm",
        "interrupted",
        "vmm",
        "steal",
        "halted",
        "idle",
        "limited",
        "paused",
        "blocked",
    ];

    /// The parts, in the order of [`TimeSplit::NAMES`].
    pub fn values(&self) -> [u64; 12] {
        [
            self.wall_ns,
            self.used_ns,
            self.guest_ns,
            self.kvm_ns,
            self.interrupted_ns,
            self.vmm_ns,
            self.steal_ns,
            self.halted_ns,
            self.idle_ns,
            self.limited_ns,
            self.paused_ns,
            self.blocked_ns,
        ]
    }

    /// Each part with its name.
    pub fn named(&self) -> impl Iterator<Item = (&'static str, u64)> {
        TimeSplit::NAMES.into_iter().zip(self.values())
    }

    /// The right-hand side of the identity: used + steal + halted + idle + limited + paused +
    /// blocked.
    pub fn accounted_ns(&self) -> u64 {
        self.used_ns
            + self.steal_ns
            + self.halted_ns
            + self.idle_ns
            + self.limited_ns
            + self.paused_ns
            + self.blocked_ns
    }

    /// wall − (used + steal + halted + idle + limited + paused + blocked): the `identity_error_ns` of the
    /// wire structs.
    pub fn identity_error_ns(&self) -> i64 {
        self.wall_ns as i64 - self.accounted_ns() as i64
    }

    /// The identity error spec section 4 allows over `wall_ns`: max(0.5 % of wall, 200 µs)
    /// after the vCPU stopped (`stopped`), 1 % of wall while it runs.
    pub fn identity_tolerance_ns(wall_ns: u64, stopped: bool) -> u64 {
        if stopped {
            (wall_ns / 200).max(200_000)
        } else {
            wall_ns / 100
        }
    }

    /// Whether the identity holds within [`TimeSplit::identity_tolerance_ns`].
    pub fn identity_holds(&self, stopped: bool) -> bool {
        self.identity_error_ns().unsigned_abs()
            <= TimeSplit::identity_tolerance_ns(self.wall_ns, stopped)
    }

    /// The split whose parts, in the order of [`TimeSplit::NAMES`], are `v`.
    pub fn from_values(v: [u64; 12]) -> TimeSplit {
        let [wall_ns, used_ns, guest_ns, kvm_ns, interrupted_ns, vmm_ns, steal_ns, halted_ns, idle_ns, limited_ns, paused_ns, blocked_ns] =
            v;
        TimeSplit {
            wall_ns,
            used_ns,
            guest_ns,
            kvm_ns,
            interrupted_ns,
            vmm_ns,
            steal_ns,
            halted_ns,
            idle_ns,
            limited_ns,
            paused_ns,
            blocked_ns,
        }
    }

    /// Each part's growth since `earlier` (0 where a part went down).
    pub fn since(&self, earlier: &TimeSplit) -> TimeSplit {
        let (now, before) = (self.values(), earlier.values());
        TimeSplit::from_values(std::array::from_fn(|i| now[i].saturating_sub(before[i])))
    }

    /// Whether a part that only grows while the figures are not reset went down since
    /// `earlier`: the figures were reset in between. Those parts are the clocks the kernel and
    /// the VMM keep (wall, used, steal and the parks); guest_ns, vmm_ns, halted_ns and
    /// blocked_ns are derived from them (an estimated split, the residual), and the VMM holds
    /// them from going down live (docs/accounting.md), but a reset is told by the clocks.
    pub fn went_down_from(&self, earlier: &TimeSplit) -> bool {
        let monotonic = |t: &TimeSplit| TimeSplit {
            guest_ns: 0,
            vmm_ns: 0,
            halted_ns: 0,
            blocked_ns: 0,
            ..*t
        };
        let (now, before) = (monotonic(self).values(), monotonic(earlier).values());
        now.iter().zip(before).any(|(n, b)| *n < b)
    }
}
