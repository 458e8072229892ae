//! Result types of the control socket, shared with the final report: the per-vCPU fields of
//! spec section 4 ([`VcpuTimes`]), histograms, VM figures, and the accounting settings.
//!
//! The VMM builds these on reader threads (never on a vCPU's hot path) and serialises them;
//! clients deserialise the same types. Every field is defined in docs/accounting.md.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::{
    GroupStats, SplitKind, SplitSource, StampClockMode, TimeSplit, VcpuMicroState, VmState,
};

/// The methods [`VcpuTimes`] and [`VcpuSummary`] share: both carry the time split, the
/// identity error and the exit counts under the same field names.
macro_rules! vcpu_figures {
    ($t:ty) => {
        impl $t {
            /// Whether the identity of spec section 4 holds: within max(0.5 % of wall, 200 µs)
            /// after the vCPU stopped (`stopped`), within 1 % while it runs.
            pub fn identity_holds(&self, stopped: bool) -> bool {
                identity_within(self.wall_ns, self.identity_error_ns, stopped)
            }

            /// The time split (the wire keeps its fields flat: see [`TimeSplit`]'s module).
            pub fn split(&self) -> TimeSplit {
                TimeSplit {
                    wall_ns: self.wall_ns,
                    used_ns: self.used_ns,
                    guest_ns: self.guest_ns,
                    kvm_ns: self.kvm_ns.unwrap_or(0),
                    interrupted_ns: self.interrupted_ns.unwrap_or(0),
                    vmm_ns: self.vmm_ns,
                    steal_ns: self.steal_ns,
                    halted_ns: self.halted_ns,
                    idle_ns: self.idle_ns,
                    limited_ns: self.limited_ns,
                    paused_ns: self.paused_ns,
                    blocked_ns: self.blocked_ns,
                }
            }

            /// Total userspace exits.
            pub fn total_exits(&self) -> u64 {
                self.exits.values().sum()
            }
        }
    };
}

/// How much the vCPU thread measures (switchable at run time; each vCPU applies a switch when
/// it next enters the guest, i.e. right after handling its next exit).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    /// Wall time and exact exit counts only.
    Off = 0,
    /// A vDSO clock read at every KVM_RUN boundary: the time split (guest/VMM estimated),
    /// exit handling times, histograms, thresholds.
    Basic = 1,
    /// Basic plus a thread-CPU-clock read at every boundary: an exact guest/VMM split.
    Full = 2,
}

impl Level {
    /// Decodes a stored level.
    pub const fn from_u8(v: u8) -> Level {
        match v {
            0 => Level::Off,
            2 => Level::Full,
            _ => Level::Basic,
        }
    }

    /// The name used on the command line and the socket.
    pub fn name(self) -> &'static str {
        match self {
            Level::Off => "off",
            Level::Basic => "basic",
            Level::Full => "full",
        }
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Level {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "off" => Ok(Level::Off),
            "basic" => Ok(Level::Basic),
            "full" => Ok(Level::Full),
            _ => Err(format!(
                "`{s}` is not an accounting level (off, basic or full)"
            )),
        }
    }
}

/// PPA-style thresholds (ppactl): each counts occurrences above it; 0 = off.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(deny_unknown_fields)]
pub struct Thresholds {
    /// Userspace handling time of one exit.
    #[serde(default)]
    pub exit_handling_ns: u64,
    /// Duration of one KVM_RUN (guest run between exits).
    #[serde(default)]
    pub guest_run_ns: u64,
    /// From the release of a parked vCPU until it is back in KVM_RUN.
    #[serde(default)]
    pub wakeup_latency_ns: u64,
    /// Steal time within one sampler window.
    #[serde(default)]
    pub steal_window_ns: u64,
}

/// A partial change of [`Thresholds`]: fields not given stay as they are.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ThresholdsUpdate {
    /// New exit_handling_ns.
    pub exit_handling_ns: Option<u64>,
    /// New guest_run_ns.
    pub guest_run_ns: Option<u64>,
    /// New wakeup_latency_ns.
    pub wakeup_latency_ns: Option<u64>,
    /// New steal_window_ns.
    pub steal_window_ns: Option<u64>,
}

impl ThresholdsUpdate {
    /// `t` with the given fields replaced.
    pub fn apply(&self, t: Thresholds) -> Thresholds {
        Thresholds {
            exit_handling_ns: self.exit_handling_ns.unwrap_or(t.exit_handling_ns),
            guest_run_ns: self.guest_run_ns.unwrap_or(t.guest_run_ns),
            wakeup_latency_ns: self.wakeup_latency_ns.unwrap_or(t.wakeup_latency_ns),
            steal_window_ns: self.steal_window_ns.unwrap_or(t.steal_window_ns),
        }
    }
}

/// The tick-based accounting `/proc` keeps for a thread: the imprecise baseline the exact
/// sources are compared against.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(deny_unknown_fields)]
pub struct TickTimes {
    /// User time (field 14 of `stat`), converted from clock ticks to ns. On PVM hosts guest
    /// time is counted here.
    pub utime_ns: u64,
    /// System time (field 15 of `stat`), converted from clock ticks to ns.
    pub stime_ns: u64,
    /// Host CPU the thread last ran on (field 39 of `stat`).
    pub processor: u32,
    /// `voluntary_ctxt_switches` from `status`.
    pub nr_switches_voluntary: u64,
    /// `nonvoluntary_ctxt_switches` from `status` (preemptions).
    pub nr_switches_involuntary: u64,
}

/// Guest time and KVM_RUN entries on one host CPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HostCpu {
    /// Host CPU number.
    pub cpu: usize,
    /// guest_ns attributed to this CPU (in proportion to KVM_RUN wall time on it).
    pub guest_ns: u64,
    /// KVM_RUN entries on it.
    pub entries: u64,
}

/// The per-vCPU fields of spec section 4 (definitions in docs/accounting.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct VcpuTimes {
    /// vCPU index.
    pub id: usize,
    /// Host thread id of the vCPU thread (0 before it started).
    pub host_tid: i32,
    /// Monotonic time elapsed.
    pub wall_ns: u64,
    /// On-CPU time of the vCPU thread.
    pub used_ns: u64,
    /// On-CPU inside KVM_RUN: guest code only where kvm_ns and interrupted_ns are measured.
    pub guest_ns: u64,
    /// On-CPU inside KVM_RUN in KVM's exit handling (KVM's tracepoints, level full); null
    /// where they cannot split it out, with the reason in `kvm_ns_reason`.
    pub kvm_ns: Option<u64>,
    /// On-CPU in host hard and soft interrupts while the vCPU thread was current (the
    /// interrupt tracepoints, level full); null where not measured (`interrupted_reason`).
    #[serde(default)]
    pub interrupted_ns: Option<u64>,
    /// ESTIMATE of the in-kernel exit handling inside guest_ns: KVM's exit count × the
    /// measured round-trip cost (cold cost for the first entry after each park).
    pub kvm_ns_estimate: Option<u64>,
    /// ESTIMATE of guest code time: guest_ns − kvm_ns_estimate.
    pub guest_code_ns_estimate: Option<u64>,
    /// Number of parks (idle, limited, paused).
    pub parks: u64,
    /// On-CPU in the VMM outside KVM_RUN.
    pub vmm_ns: u64,
    /// Runnable, waiting for a host CPU.
    pub steal_ns: u64,
    /// Blocked inside KVM_RUN.
    pub halted_ns: u64,
    /// Parked because the guest asked to idle.
    pub idle_ns: u64,
    /// Parked because a CPU limit was exhausted.
    pub limited_ns: u64,
    /// Parked because an operator paused the VM.
    pub paused_ns: u64,
    /// Off CPU and not runnable, outside parks and halts (asleep in the kernel).
    pub blocked_ns: u64,
    /// How guest/vmm were split: `exact` (level full), `estimated` (basic), `mixed`, `none`.
    pub split: SplitKind,
    /// What split level full's intervals: `records` (context-switch records), `cpu_clock`,
    /// `mixed`, or `none` (no interval at level full).
    pub split_source: SplitSource,
    /// Boundaries at which the records may have missed a switch (the window's blocked and
    /// halted time then come from the thread CPU clock: docs/accounting.md).
    pub records_lost: u64,
    /// Run-queue wait outside parks as the context-switch records saw it (the preempted
    /// off-CPU episodes): a cross-check of steal_ns from an independent source (steal_ns also
    /// holds the wake-up wait after a sleep and the run-queue wait around parks).
    pub records_preempted_ns: u64,
    /// Time on a CPU outside parks as the vCPU thread measured it per interval at level full
    /// (each interval's wall time less the records' off-CPU episodes): a cross-check of
    /// used_ns less the parks' CPU from an independent source. Null unless every interval of
    /// the window was measured so (level full throughout, no record lost).
    #[serde(default)]
    pub records_on_cpu_ns: Option<u64>,
    /// wall − (used + steal + halted + idle + limited + paused + blocked).
    pub identity_error_ns: i64,
    /// Micro-state at the time of reading: guest, vmm, idle, limited, paused, or finished.
    pub state: VcpuMicroState,
    /// Userspace exits by reason.
    pub exits: BTreeMap<String, u64>,
    /// Userspace handling time by reason.
    pub exit_ns: BTreeMap<String, u64>,
    /// Why kvm_ns is null (one sentence), else null.
    #[serde(default)]
    pub kvm_ns_reason: Option<String>,
    /// Why interrupted_ns is null (one sentence), else null.
    #[serde(default)]
    pub interrupted_reason: Option<String>,
    /// Exits KVM handled in the kernel, by hardware reason (VMX/SVM names as the kernel
    /// prints them; unknown codes as numbers), from KVM's tracepoints at level full.
    #[serde(default)]
    pub kvm_exits: BTreeMap<String, u64>,
    /// Their handling time on a CPU (interrupts excluded), by reason.
    #[serde(default)]
    pub kvm_exit_ns: BTreeMap<String, u64>,
    /// VM exits KVM forwarded to userspace, as its tracepoints saw them (one per userspace
    /// exit other than `intr`). With `kvm_exits` they sum to KVM's `exits` statistic over the
    /// runs traced.
    #[serde(default)]
    pub kvm_exits_to_user: u64,
    /// Host interrupts taken while the vCPU thread was current, by kind (level full).
    #[serde(default)]
    pub interrupts: BTreeMap<String, u64>,
    /// KVM binary statistics, deltas.
    pub kvm_stats: BTreeMap<String, u64>,
    /// Per host CPU.
    pub host_cpus: Vec<HostCpu>,
    /// Host CPU changes between KVM_RUN entries.
    pub migrations: u64,
    /// Occurrences above each threshold.
    pub thresholds: BTreeMap<String, u64>,
    /// Wall time inside KVM_RUN (timed levels).
    pub kvm_run_wall_ns: u64,
    /// On-CPU time inside KVM_RUN during level full, as the records (or the thread CPU clock)
    /// measured it per KVM_RUN; null when no KVM_RUN ran at level full. Where the split is
    /// `tracepoints` it is guest + kvm + the interrupts taken inside KVM_RUN.
    #[serde(default)]
    pub kvm_run_cpu_ns: Option<u64>,
    /// On-CPU time around parks (part of vmm_ns).
    pub park_cpu_ns: u64,
    /// Tick-based utime + stime from /proc (final reports only).
    pub proc_ticks: Option<TickTimes>,
    /// Runaway and overload detections since the vCPU started.
    pub overloads: u64,
    /// The CPUs its thread was placed on (`--pin`, `set-pin`, the NUMA node's, or what it
    /// inherited), in the kernel's list form; null before it was placed.
    #[serde(default)]
    pub cpus: Option<String>,
    /// The host CPU of its last entry into the guest (null before the first timed entry:
    /// level off reads none).
    #[serde(default)]
    pub last_cpu: Option<u32>,
    /// Run-queue wait of the vCPU thread before its clocks started (its creation, the
    /// warm-up, the start gate): outside wall_ns and steal_ns, and unchanged by a reset. x86
    /// KVM's paravirt steal clock counts the thread's run-queue wait from its creation, so a
    /// guest's own steal can exceed steal_ns by this much.
    pub steal_before_start_ns: u64,
    /// How its thread takes its stamps now: `tsc` (extrapolated), `learning`, `vdso` or
    /// `given_up`; null before it started.
    #[serde(default)]
    pub stamp_clock: Option<StampClockMode>,
    /// Times its stamp clock found the TSC extrapolation off the clock by more than its bound
    /// and measured the rate again (each one moved time between vmm_ns and guest_ns by up to
    /// that bound; docs/accounting.md, "The stamp clock").
    #[serde(default)]
    pub stamp_clock_drifts: u64,
}

vcpu_figures!(VcpuTimes);

/// Whether an identity error is within spec section 4's tolerance: max(0.5 % of wall,
/// 200 µs) after the vCPU stopped, 1 % of wall while it runs.
pub fn identity_within(wall_ns: u64, error_ns: i64, stopped: bool) -> bool {
    error_ns.unsigned_abs() <= TimeSplit::identity_tolerance_ns(wall_ns, stopped)
}

/// The overview of one vCPU in `stats`: the section 4 times and the exit counts. `vcpu`
/// gives the whole [`VcpuTimes`] of one vCPU (KVM statistics, host CPUs, estimates, exit
/// handling times, thresholds); `stats` stays small so that a monitor can poll a large VM
/// often without taking CPU from its guests.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct VcpuSummary {
    /// vCPU index.
    pub id: usize,
    /// Host thread id (0 before the thread started).
    pub host_tid: i32,
    /// Micro-state at the time of reading.
    pub state: VcpuMicroState,
    /// Monotonic time elapsed.
    pub wall_ns: u64,
    /// On-CPU time of the vCPU thread.
    pub used_ns: u64,
    /// On-CPU inside KVM_RUN (guest code only where kvm_ns and interrupted_ns are measured).
    pub guest_ns: u64,
    /// In-kernel exit handling, where the host can split it out.
    pub kvm_ns: Option<u64>,
    /// Host interrupts while the vCPU thread was current, where measured.
    #[serde(default)]
    pub interrupted_ns: Option<u64>,
    /// On-CPU in the VMM outside KVM_RUN.
    pub vmm_ns: u64,
    /// Runnable, waiting for a host CPU.
    pub steal_ns: u64,
    /// Blocked inside KVM_RUN.
    pub halted_ns: u64,
    /// Parked because the guest asked to idle.
    pub idle_ns: u64,
    /// Parked because a CPU limit was exhausted.
    pub limited_ns: u64,
    /// Parked because an operator paused the VM.
    pub paused_ns: u64,
    /// Off CPU and not runnable, outside parks and halts (asleep in the kernel).
    pub blocked_ns: u64,
    /// wall − (used + steal + halted + idle + limited + paused + blocked).
    pub identity_error_ns: i64,
    /// Number of parks.
    pub parks: u64,
    /// Userspace exits by reason (reasons with at least one exit).
    pub exits: BTreeMap<String, u64>,
    /// Runaway and overload detections since the vCPU started.
    pub overloads: u64,
    /// The CPUs its thread was placed on, list form (see [`VcpuTimes::cpus`]).
    #[serde(default)]
    pub cpus: Option<String>,
    /// The host CPU of its last entry into the guest.
    #[serde(default)]
    pub last_cpu: Option<u32>,
}

vcpu_figures!(VcpuSummary);

impl From<VcpuTimes> for VcpuSummary {
    fn from(t: VcpuTimes) -> Self {
        VcpuSummary {
            id: t.id,
            host_tid: t.host_tid,
            state: t.state,
            wall_ns: t.wall_ns,
            used_ns: t.used_ns,
            guest_ns: t.guest_ns,
            kvm_ns: t.kvm_ns,
            interrupted_ns: t.interrupted_ns,
            vmm_ns: t.vmm_ns,
            steal_ns: t.steal_ns,
            halted_ns: t.halted_ns,
            idle_ns: t.idle_ns,
            limited_ns: t.limited_ns,
            paused_ns: t.paused_ns,
            blocked_ns: t.blocked_ns,
            identity_error_ns: t.identity_error_ns,
            parks: t.parks,
            exits: t.exits.into_iter().filter(|(_, n)| *n > 0).collect(),
            overloads: t.overloads,
            cpus: t.cpus,
            last_cpu: t.last_cpu,
        }
    }
}

/// JSON form of a histogram.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HistogramJson {
    /// Fractional bits of the slot scheme.
    pub frac_bits: u8,
    /// Number of samples.
    pub count: u64,
    /// Sum of the samples, nanoseconds.
    pub sum: u64,
    /// sum / count, nanoseconds (0 when empty).
    pub avg: u64,
    /// Largest sample, nanoseconds.
    pub max: u64,
    /// Median, within one slot width.
    pub p50: u64,
    /// 90th percentile, within one slot width.
    pub p90: u64,
    /// 99th percentile, within one slot width.
    pub p99: u64,
    /// 99.9th percentile, within one slot width.
    pub p999: u64,
    /// The non-empty slots, ascending.
    pub slots: Vec<SlotJson>,
}

/// One non-empty slot in [`HistogramJson`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SlotJson {
    /// Slot index.
    pub slot: usize,
    /// Smallest value of the slot (inclusive).
    pub lo: u64,
    /// Largest value of the slot (inclusive).
    pub hi: u64,
    /// Samples in the slot.
    pub count: u64,
    /// Sum of the samples in the slot, nanoseconds.
    pub sum: u64,
}

/// Result of `version`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct VersionInfo {
    /// The VMM's version.
    pub version: String,
    /// [`crate::API_VERSION`].
    pub api: u32,
    /// The guest ABI version, `major.minor`.
    pub guest_abi: String,
}

/// VM-wide figures of `stats`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct VmStats {
    /// The VM's name (the `vm` label of the metrics).
    pub name: String,
    /// The VMM's process id.
    pub pid: u32,
    /// `created`, `running`, `paused`, `stopping` or `finished`.
    pub state: VmState,
    /// vCPU count.
    pub vcpus: usize,
    /// Time since the vCPUs were started, at the moment the figures were taken (the server
    /// may answer several requests from one snapshot, at most 15 ms old).
    pub uptime_ns: u64,
    /// Accounting level.
    pub level: Level,
    /// The thresholds in force.
    pub thresholds: Thresholds,
    /// CPU time of every non-vCPU thread of the VMM process.
    pub host_threads_ns: u64,
    /// The process's CPU: vCPU threads, device threads, the rest.
    #[serde(default)]
    pub host_cpu_ns: crate::HostCpuSplit,
    /// CPU pressure of the VM (docs/accounting.md, "Pressure"), as of the last 8 ms refresh.
    #[serde(default)]
    pub pressure: crate::Pressure,
}

/// Result of `stats`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Stats {
    /// The VM.
    pub vm: VmStats,
    /// Each vCPU.
    pub vcpus: Vec<VcpuSummary>,
    /// CPU-limit groups, the VM-wide limit (named `vm`) first when there is one.
    pub groups: Vec<GroupStats>,
    /// Each device (spec section 10).
    #[serde(default)]
    pub devices: Vec<crate::DeviceStats>,
}
