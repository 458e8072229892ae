//! The decoded PPA page as the `guest` command and the final report give it (docs/abi.md,
//! docs/accounting.md "The guest's view"): what the guest published, checked, beside what the
//! host measured, with the guest agent's record, alarms and resets.

use serde::{Deserialize, Serialize};

use crate::{GuestAlarmsView, GuestResetView};

/// One guest thread as decoded from the PPA page (result of `guest`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GuestThreadView {
    /// Index of the record.
    pub slot: usize,
    /// Thread id.
    pub tid: u32,
    /// Process id.
    pub tgid: u32,
    /// Name (invalid UTF-8 replaced, see `errors`).
    pub comm: String,
    /// CPU it last ran on.
    pub last_cpu: u32,
    /// On-CPU time, ns.
    pub on_cpu_ns: u64,
    /// User time, ns.
    pub utime_ns: u64,
    /// System time, ns.
    pub stime_ns: u64,
    /// Run-queue wait, ns.
    pub run_delay_ns: u64,
    /// Timeslices.
    pub timeslices: u64,
    /// Voluntary switches.
    pub nvcsw: u64,
    /// Involuntary switches.
    pub nivcsw: u64,
    /// Delay accounting totals (block I/O, swap-in, reclaim, IRQ), ns.
    pub delays_ns: [u64; 4],
    /// The delay totals layout 1.5 added (thrashing, compaction, write-protect copy), ns.
    #[serde(default)]
    pub delays_more_ns: [u64; 3],
    /// How many delays of each kind (block I/O, swap-in, reclaim, IRQ, thrashing,
    /// compaction, write-protect copy), layout 1.5.
    #[serde(default)]
    pub delay_counts: [u64; 7],
    /// Threshold occurrences the guest agent counted (layout 1.5): sample intervals in which
    /// the thread's mean run-queue wait per wait, its on-CPU time per timeslice, its
    /// involuntary switches exceeded the agent's thresholds.
    #[serde(default)]
    pub over: [u64; 3],
    /// Application work count.
    pub work: u64,
    /// Guest time of its last update, ns.
    pub updated_ns: u64,
    /// How far its update lags the guest header's, ns.
    pub lag_ns: u64,
    /// Lags the header by more than a second.
    pub stale: bool,
    /// Scheduler state as Linux shows it (`R`, `S`, `D`, ...; `X`: the thread exited and
    /// these are its final figures, not in `transient_*` while listed); empty when the guest
    /// does not say (layout 1.0, the tiny guest).
    #[serde(default)]
    pub state: String,
    /// A kernel thread (layout 1.1).
    #[serde(default)]
    pub kernel: bool,
    /// On-CPU time in the guest agent's last sample interval, ns (layout 1.1).
    #[serde(default)]
    pub interval_on_cpu_ns: u64,
}

/// A guest agent's own record (layout 1.1, docs/agent.md): how it samples, what it costs,
/// the threads it could not publish and the transient tasks it counted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GuestAgentView {
    /// The agent's process id in the guest.
    pub pid: u32,
    /// Sample interval, ns.
    pub interval_ns: u64,
    /// Samples taken.
    pub samples: u64,
    /// CPU time of its last sample, ns.
    pub sample_cpu_ns: u64,
    /// The most CPU time one sample took, ns.
    pub sample_max_cpu_ns: u64,
    /// All its CPU time since it started, ns.
    pub agent_cpu_ns: u64,
    /// Threads alive at the last sample.
    pub threads_seen: u32,
    /// Thread records published at the last sample.
    pub threads_published: u32,
    /// The aggregate record: threads alive but not published, their on-CPU time and their
    /// on-CPU time in the last interval (ns).
    pub rest_count: u64,
    /// See `rest_count`.
    pub rest_on_cpu_ns: u64,
    /// See `rest_count`.
    pub rest_interval_on_cpu_ns: u64,
    /// Tasks that started and ended between two samples, and their CPU time (ns): part of
    /// the view's `transient_count` and `transient_cpu_ns`.
    pub unseen_count: u64,
    /// See `unseen_count`.
    pub unseen_cpu_ns: u64,
    /// Processes (thread groups) that ended.
    pub exited_processes: u64,
    /// Exits found in /proc without an exit notification.
    pub exits_missed: u64,
    /// Exits come from taskstats notifications (none missed); else from what /proc shows.
    pub taskstats: bool,
    /// The guest kernel's delay accounting is on (thread delay totals are filled).
    pub delayacct: bool,
    /// The kernel dropped exit notifications at least once.
    pub exits_lost: bool,
    /// The CPU records' context switches are filled.
    pub cpu_switches: bool,
    /// The agent stopped; what it published is its last.
    pub stopped: bool,
    /// Guest time of the record's last update, ns.
    pub updated_ns: u64,
}

/// One guest CPU as decoded from the PPA page.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GuestCpuView {
    /// CPU number.
    pub cpu: u32,
    /// user, system, idle, iowait, irq, softirq, steal, ns.
    pub times_ns: [u64; 7],
    /// Interrupts.
    pub interrupts: u64,
    /// Context switches.
    pub context_switches: u64,
    /// Softirqs by kind.
    pub softirqs: [u64; 10],
    /// Guest time of its last update, ns.
    pub updated_ns: u64,
    /// Threshold occurrences (layout 1.5): sample intervals in which the CPU's hard-interrupt
    /// and softirq time exceeded the agent's thresholds.
    #[serde(default)]
    pub over: [u64; 2],
}

/// The decoded PPA page (result of `guest`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GuestView {
    /// Whether the VM has a PPA page.
    pub page: bool,
    /// Whether the guest has published a valid header.
    pub published: bool,
    /// The guest's layout version, `major.minor`.
    pub version: String,
    /// Guest CPUs the guest declares.
    pub nr_cpus: u32,
    /// Guest time of the last update, ns.
    pub updated_ns: u64,
    /// Threads, by on-CPU time, highest first.
    pub threads: Vec<GuestThreadView>,
    /// Guest CPUs.
    pub cpus: Vec<GuestCpuView>,
    /// Threads that exited (those still listed in `threads`, state `X`, are not counted here).
    pub transient_count: u64,
    /// Their CPU time, ns.
    pub transient_cpu_ns: u64,
    /// What was wrong with what the guest wrote (each a sentence); valid parts are shown.
    pub errors: Vec<String>,
    /// The host section as the guest sees it: each vCPU's steal, limited and used ns and
    /// the VM uptime of its last refresh.
    pub host: Vec<[u64; 4]>,
    /// The guest agent's own record, when a guest agent publishes (layout 1.1).
    #[serde(default)]
    pub agent: Option<GuestAgentView>,
    /// Per vCPU, whether a `reset` restarted its host figures: they then count from the
    /// reset, while the guest's own figures count from its boot (empty: none was reset).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub host_reset: Vec<bool>,
    /// The guest agent's alarm ring and the alarms the VMM forwarded (layout 1.5; absent
    /// without a guest agent of 1.5 or later).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alarms: Option<GuestAlarmsView>,
    /// Guest resets asked and carried out (layout 1.5; absent when none was asked and the
    /// agent says nothing of one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reset: Option<GuestResetView>,
}
