//! The CPU limits' figures in `stats`, `groups` and the report ([`GroupStats`]): what each
//! limit allowed, what its members used and were charged, how they were stopped, and what
//! their stops cost (docs/limits.md defines every field).
//!
//! The VMM's limiter thread builds them from its periods (never on a vCPU's hot path); clients
//! deserialise the same types.

use serde::{Deserialize, Serialize};

use crate::{HistogramJson, LimitBackend, LimitKick, LimitScope};

/// One CPU limit (a vCPU group's, or the VM's as group `vm`) and what it did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GroupStats {
    /// Group name (`vm` for the VM-wide limit).
    pub name: String,
    /// Member vCPUs.
    pub vcpus: Vec<usize>,
    /// `vmm` (enforced by the VMM) or `cgroup`.
    pub backend: LimitBackend,
    /// The limit as given (`50%`, `15ms/10ms`).
    pub limit: String,
    /// CPU time allowed per period.
    pub quota_ns: u64,
    /// Period length.
    pub period_ns: u64,
    /// Periods completed since the limit was set.
    pub periods: u64,
    /// Length of those periods, summed: the time `used_ns` was measured over (the periods of
    /// a limit changed at run time need not all have the same length, and a removed limit has
    /// a `period_ns` of 0 but keeps its periods).
    #[serde(default)]
    pub periods_ns: u64,
    /// Periods in which a member had to stop.
    pub throttled_periods: u64,
    /// CPU time charged to the members in completed periods: their threads' CPU time less
    /// what their stops cost (`stops`), which the VMM pays (docs/limits.md, "What a stop
    /// costs, and who pays it"). Its `kvm_ns_estimate` part makes this figure an estimate to
    /// that extent.
    pub used_ns: u64,
    /// What stopping and restarting the members cost in those periods, outside the quota.
    #[serde(default)]
    pub stops: LimitStops,
    /// What the limit covers: `vcpus` (its members' threads) or, for the VM's limit, `vm`
    /// (the device threads too: their CPU is charged, and they are held once the vCPUs are).
    #[serde(default)]
    pub scope: LimitScope,
    /// Scope `vm`: the device threads' CPU in the completed periods (part of `used_ns`).
    #[serde(default)]
    pub devices_ns: u64,
    /// Scope `vm`: the time the device threads were held (their `limited_ns`, summed), and
    /// how often one was.
    #[serde(default)]
    pub devices_limited_ns: u64,
    /// See `devices_limited_ns`.
    #[serde(default)]
    pub device_holds: u64,
    /// Time the members spent stopped by this limit (their limited_ns, summed).
    pub limited_ns: u64,
    /// Completed periods in which the members took turns (docs/limits.md, "Turns"): the quota
    /// gave each busy member less than 1 ms, so some ran the period while the others waited.
    #[serde(default)]
    pub turn_periods: u64,
    /// Completed periods whose end a turn straddled (docs/limits.md, "Turns"): its members
    /// were released late in the period and ran on into the next one.
    #[serde(default)]
    pub straddled_periods: u64,
    /// Largest overshoot of a period (used − quota when positive).
    pub overshoot_max_ns: u64,
    /// Overshoot per period, for periods that overshot.
    pub overshoot: HistogramJson,
    /// How the members were stopped.
    pub kicks: LimitKicks,
}

impl GroupStats {
    /// What the members used over the completed periods, in percent of one CPU
    /// (`used_ns` / `periods_ns`); `None` before a period has completed.
    pub fn used_percent(&self) -> Option<f64> {
        (self.periods_ns > 0).then(|| self.used_ns as f64 * 100.0 / self.periods_ns as f64)
    }
}

/// What a limit's stops cost in its completed periods (`stops` of [`GroupStats`]): the CPU of
/// its members' threads from each stop's start (after the spin of an exact stop, at a
/// timer's firing that re-armed, or at a limit's request) to the next entry into the guest,
/// and the KVM round trips those stops added. Not charged to the limit: the members' threads
/// used `used_ns + cpu_ns + kvm_ns_estimate` in those periods.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LimitStops {
    /// Stops (limited parks and timer firings) that began in those periods.
    pub count: u64,
    /// Their CPU outside KVM_RUN (the park path, the wait and wake-up, the paravirtual
    /// clock's notice, re-arming the timer), measured by the threads' CPU clocks.
    pub cpu_ns: u64,
    /// **Estimate**: the KVM round trips those stops forced (an exit out of the guest and
    /// the entry back), each the VM's measured `kvm_exit_cost_ns`, or after a park the cold
    /// round trip of a park that long (between `kvm_exit_cost_after_park_ns` and
    /// `kvm_exit_cost_after_long_park_ns`); for a stop that parked without a forced exit, the
    /// cold entry's cost beyond a warm one.
    pub kvm_ns_estimate: u64,
}

impl LimitStops {
    /// Both parts: what the limit did not charge.
    pub fn total_ns(&self) -> u64 {
        self.cpu_ns + self.kvm_ns_estimate
    }
}

/// How a limit's members were stopped since the limit was set (`kicks` of [`GroupStats`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LimitKicks {
    /// The path in use.
    pub path: LimitKick,
    /// Stops made by the members' kick timers.
    pub timer: u64,
    /// Timer firings after which a member had CPU left (it had been preempted or idle, so it
    /// used less CPU than the wall time elapsed) and re-armed its timer instead of stopping.
    pub rearms: u64,
    /// Stops made by the limiter thread's kick: every stop without timers, else the fallback
    /// when a timer was late.
    pub limiter: u64,
    /// Where the time of the members' timer stops went, stage by stage, since the limit was
    /// set (null with the cgroup backend, whose stops the kernel makes where nothing sees
    /// them).
    #[serde(default)]
    pub stages: Option<KickStages>,
}

/// The stages of a limit's timer stops, wall time of each stop's stage merged over the
/// members (docs/limits.md, "Where the overshoot comes from"). A vCPU's stages are its own,
/// whichever of its limits stopped it: a vCPU in a group and under the VM's limit counts each
/// stop in both.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KickStages {
    /// From the instant the timer was armed for to its signal handler: the timer's expiry,
    /// the signal, the vCPU's way out of the guest and out of KVM_RUN.
    pub to_handler: HistogramJson,
    /// From the handler to the run loop's stop decision.
    pub to_decision: HistogramJson,
    /// The CPU time of the vCPU's spin in user space from the decision to its CPU target,
    /// when its timer fired before it (0 when it fired at or past it). CPU, not wall: what the
    /// exact stop costs, the same whether or not the thread was preempted while it spun.
    pub spin: HistogramJson,
    /// From the end of the spin to the park.
    pub to_park: HistogramJson,
}

impl KickStages {
    /// The stages by name, in the order a stop goes through them.
    pub fn named(&self) -> [(&'static str, &HistogramJson); 4] {
        [
            ("to_handler", &self.to_handler),
            ("to_decision", &self.to_decision),
            ("spin", &self.spin),
            ("to_park", &self.to_park),
        ]
    }

    /// One line for the text outputs: `N timer stops, p50/p99 µs to handler A/B, to decision
    /// C/D, spin G/H, to park E/F`, or `no timer stop measured` (a limit whose stops were all the
    /// limiter's, or none yet): a limit of the VMM backend always has the line, so the text
    /// report has the same lines on a quiet host and a loaded one.
    pub fn summary(&self) -> String {
        if self.to_handler.count == 0 {
            return "no timer stop measured".to_string();
        }
        let us = |ns: u64| ns as f64 / 1e3;
        let parts: Vec<String> = self
            .named()
            .iter()
            .map(|(name, h)| {
                let name = name.replace('_', " ");
                format!("{name} {:.1}/{:.1}", us(h.p50), us(h.p99))
            })
            .collect();
        format!(
            "{} timer stops, p50/p99 us {}",
            self.to_handler.count,
            parts.join(", ")
        )
    }
}
