//! Events streamed to a connection after `subscribe`: one JSON object per line, told apart
//! from responses by their `event` member (responses have `ok`).

use serde::{Deserialize, Serialize};

use crate::{
    GuestAlarmView, OverloadKind, PressureKind, Threshold, ThrottleEndWhy, VcpuEndKind, VmEnd,
};

/// The kinds a client can subscribe to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum EventKind {
    /// A vCPU thread ended.
    VcpuExit,
    /// Every vCPU ended: the VM is about to write its final report.
    VmExit,
    /// A threshold counter grew.
    Threshold,
    /// A CPU limit stopped its first member in a period.
    ThrottleStart,
    /// A CPU limit released its members (period boundary, budget redistributed, or a turn
    /// that straddles the period's end).
    ThrottleEnd,
    /// A runaway or overloaded vCPU (PPA requirement 20).
    Overload,
    /// The connection's pressure trigger fired.
    Pressure,
    /// The guest agent raised an alarm (a threshold inside the guest).
    GuestAlarm,
}

impl EventKind {
    /// Every kind that needs no argument (what an empty `events` list subscribes to;
    /// `pressure` needs a trigger).
    pub const ALL: [EventKind; 7] = [
        EventKind::VcpuExit,
        EventKind::VmExit,
        EventKind::Threshold,
        EventKind::ThrottleStart,
        EventKind::ThrottleEnd,
        EventKind::Overload,
        EventKind::GuestAlarm,
    ];
}

/// One event line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "event", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Event {
    /// A vCPU thread ended.
    VcpuExit {
        /// Time since the VM started, ns.
        uptime_ns: u64,
        /// vCPU index.
        vcpu: usize,
        /// `exited`, `failed`, `error` or `stopped`.
        end: VcpuEndKind,
        /// The guest's exit code, when it exited.
        exit_code: Option<u64>,
    },
    /// Every vCPU ended.
    VmExit {
        /// Time since the VM started, ns.
        uptime_ns: u64,
        /// `completed`, `failed`, `timeout` or `shutdown`.
        end: VmEnd,
    },
    /// A threshold counter of a vCPU grew since the last check (checked every 10 ms).
    Threshold {
        /// Time since the VM started, ns.
        uptime_ns: u64,
        /// vCPU index.
        vcpu: usize,
        /// Threshold name (`exit_handling_ns`, ...).
        name: Threshold,
        /// The threshold value in force, ns.
        threshold_ns: u64,
        /// New occurrences since the previous event of this vCPU and name.
        count: u64,
        /// Occurrences since the vCPU started (a `reset` does not restart this count).
        total: u64,
    },
    /// A CPU limit stopped members.
    ThrottleStart {
        /// Time since the VM started, ns.
        uptime_ns: u64,
        /// Group name (`vm` for the VM-wide limit).
        group: String,
        /// The members stopped.
        vcpus: Vec<usize>,
        /// CPU time the members used in this period so far.
        used_ns: u64,
        /// The period's quota.
        quota_ns: u64,
    },
    /// A CPU limit released every member it had stopped.
    ThrottleEnd {
        /// Time since the VM started, ns.
        uptime_ns: u64,
        /// Group name.
        group: String,
        /// `period` (a new period began), `redistributed` (members went idle) or `turn` (a
        /// turn that straddles the period's end began).
        why: ThrottleEndWhy,
    },
    /// A vCPU stayed in the guest too long without an exit (`runaway`), or used more than
    /// its share for too many windows (`overload`); the action was applied.
    Overload {
        /// Time since the VM started, ns.
        uptime_ns: u64,
        /// vCPU index.
        vcpu: usize,
        /// `runaway` or `overload`.
        kind: OverloadKind,
        /// What was seen, in one sentence.
        detail: String,
        /// `notify`, `pause` or `throttle:LIMIT`.
        action: String,
    },
    /// The connection's pressure trigger fired: the VM's stall of `kind` within the last
    /// window exceeded the threshold (at most one event per window).
    Pressure {
        /// Time since the VM started, ns.
        uptime_ns: u64,
        /// `some` or `full`.
        kind: PressureKind,
        /// The trigger's threshold, µs.
        threshold_us: u64,
        /// The trigger's window, µs.
        window_us: u64,
        /// Stall within the window, µs.
        stall_us: u64,
    },
    /// The guest agent raised an alarm: a thread or a CPU of the guest exceeded one of the
    /// agent's thresholds in a sample (docs/agent.md, "Thresholds and alarms").
    GuestAlarm {
        /// Time since the VM started when the VMM read it, ns.
        uptime_ns: u64,
        /// The alarm.
        #[serde(flatten)]
        alarm: GuestAlarmView,
    },
    /// This client did not read fast enough: `count` events were dropped before the next one.
    Dropped {
        /// Events lost.
        count: u64,
    },
}

impl Event {
    /// The kind a subscription must include to receive this event (`None`: every subscriber).
    pub fn kind(&self) -> Option<EventKind> {
        match self {
            Event::VcpuExit { .. } => Some(EventKind::VcpuExit),
            Event::VmExit { .. } => Some(EventKind::VmExit),
            Event::Threshold { .. } => Some(EventKind::Threshold),
            Event::ThrottleStart { .. } => Some(EventKind::ThrottleStart),
            Event::ThrottleEnd { .. } => Some(EventKind::ThrottleEnd),
            Event::Overload { .. } => Some(EventKind::Overload),
            Event::Pressure { .. } => Some(EventKind::Pressure),
            Event::GuestAlarm { .. } => Some(EventKind::GuestAlarm),
            Event::Dropped { .. } => None,
        }
    }

    /// The event as one JSON line, newline included.
    pub fn to_line(&self) -> String {
        let mut s = serde_json::to_string(self).unwrap_or_default();
        s.push('\n');
        s
    }
}
