//! The control-socket protocol of PPA-VMM (spec section 6, docs/control.md), in a crate that
//! links no KVM code so that clients (`ppa-vmm ctl`, `ppa-vmm top`, an operator's own tools)
//! can use the same types as the server.
//!
//! Data flow: a client writes one JSON object per line, a [`Request`] (`{"id": ANY, "cmd":
//! NAME, ...arguments}`). The server turns the line into a [`Request`] with
//! [`parse_request`], which refuses over-long lines, bad JSON, keys given twice, unknown
//! commands and unknown fields with an [`ErrorBody`]; it answers each request with one [`Response`] line whose
//! `result` is the command's result type ([`VersionInfo`], [`Stats`], [`VcpuTimes`], ...).
//! After `subscribe` the connection also carries [`Event`] lines.
//!
//! Values drawn from a closed set of words (states, end reasons, the split kind, backends,
//! threshold names) are enums that serialise as those words ([`VmState`], [`SplitKind`], ...);
//! a vCPU's time split reaches code as one [`TimeSplit`], while the wire keeps its fields flat.
//!
//! Text that both the VMM's final report and the clients print is made here too, from these
//! types only: [`guest_view`] (GUEST VIEW tables), [`devices_text`] (devices and the VMM
//! process's CPU) and [`describe`] (an error and its causes on one line).

use serde::{Deserialize, Serialize};
use serde_json::Value;

mod clip;
mod devices;
pub mod devices_text;
mod event;
mod guest;
mod guest_alarms;
pub mod guest_view;
pub mod http;
mod limits;
mod names;
mod pressure;
mod request;
mod threads;
mod time_split;
mod types;

pub use clip::{clip, clip_middle, describe, MESSAGE_MAX, QUOTE_MAX};
pub use devices::{
    BlkStats, DeviceCpu, DeviceStats, DeviceThreadInfo, DeviceThreadStats, DriverStats, FrameCpu,
    HostCpuSplit, PerPacket, QueueStats,
};
pub use event::{Event, EventKind};
pub use guest::{GuestAgentView, GuestCpuView, GuestThreadView, GuestView};
pub use guest_alarms::{
    alarms_text as guest_alarms_text, GuestAlarmView, GuestAlarmsView, GuestResetResult,
    GuestResetView, ALARM_WHAT,
};
pub use limits::{GroupStats, KickStages, LimitKicks, LimitStops};
pub use names::{
    BlkRequestKind, BlkStatus, DeviceHealth, DeviceKind, DropReason, LimitBackend, LimitKick,
    LimitScope, OverloadKind, QueueKind, SplitKind, SplitSource, StampClockMode, ThreadState,
    Threshold, ThrottleEndWhy, UnknownName, VcpuEndKind, VcpuMicroState, VmEnd, VmState,
};
pub use pressure::{
    GroupPressure, Pressure, PressureKind, PressureLine, PressureReport, PressureTrigger,
    TRIGGER_MAX_WINDOW_US, TRIGGER_MIN_WINDOW_US,
};
pub use request::{parse_request, Request, RequestId};
pub use threads::{ServiceThreadInfo, ThreadInfo, Threads};
pub use time_split::TimeSplit;
pub use types::{
    identity_within, HistogramJson, HostCpu, Level, SlotJson, Stats, Thresholds, ThresholdsUpdate,
    TickTimes, VcpuSummary, VcpuTimes, VersionInfo, VmStats,
};

/// Version of this protocol; bumped when a command or field changes meaning.
pub const API_VERSION: u32 = 1;

/// Longest request line the server accepts, newline excluded.
pub const MAX_REQUEST_BYTES: usize = 64 * 1024;

/// Histogram export form.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum HistogramFormat {
    /// [`HistogramJson`].
    #[default]
    Json,
    /// The kstats text form: one self-contained line per slot and vCPU.
    Text,
}

/// A command and its arguments (the request without its `id`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "cmd", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Command {
    /// Server and protocol versions.
    Version {},
    /// Every vCPU's section 4 figures, and the VM's.
    Stats {},
    /// One vCPU's section 4 figures.
    Vcpu {
        /// vCPU index.
        vcpu: usize,
    },
    /// One histogram, of one vCPU or merged over all.
    Histogram {
        /// `exit_handling`, `exit_handling.REASON`, `guest_run` or `wakeup_latency`.
        name: String,
        /// One vCPU; all vCPUs when absent.
        #[serde(default)]
        vcpu: Option<usize>,
        /// `json` (default) or `text`.
        #[serde(default)]
        format: HistogramFormat,
    },
    /// Restarts the figures of one vCPU, or of every vCPU, from zero.
    Reset {
        /// One vCPU; all when absent.
        #[serde(default)]
        vcpu: Option<usize>,
    },
    /// Switches the accounting level.
    SetLevel {
        /// The new level.
        level: Level,
    },
    /// Changes some thresholds; those not given stay as they are.
    SetThresholds {
        /// Userspace handling time of one exit, ns (0 = off).
        #[serde(default)]
        exit_handling_ns: Option<u64>,
        /// Duration of one KVM_RUN, ns.
        #[serde(default)]
        guest_run_ns: Option<u64>,
        /// Release of a parked vCPU until it is back in KVM_RUN, ns.
        #[serde(default)]
        wakeup_latency_ns: Option<u64>,
        /// Steal within one sampler window, ns.
        #[serde(default)]
        steal_window_ns: Option<u64>,
    },
    /// vCPU index → host thread id.
    Threads {},
    /// Sets, changes or removes a CPU limit; it takes effect at the limit's next period
    /// boundary (a new limit at once).
    SetLimit {
        /// A group name, or `vm` for the VM-wide limit.
        group: String,
        /// `N%`, `QUOTA/PERIOD`, or `none` to remove it.
        limit: String,
    },
    /// Moves the threads `key` names to `cpus` at once, replacing that key's rule
    /// (`--pin KEY=CPUS` at run time).
    SetPin {
        /// `vcpus`, `vcpuN`, a device id (`net0`), a queue pair (`net0-qp1`) or `service`.
        key: String,
        /// The CPUs, in the kernel's list form (`4`, `0-3,6`).
        cpus: String,
    },
    /// Replaces a network device's or a disk's rate limiters with the buckets of a `rate=`
    /// value (full, as Firecracker's update does), or takes them away with `none`; answers the
    /// device's figures.
    SetRate {
        /// Device id (`net0`, `blk0`).
        device: String,
        /// `rate=` as `--net` or `--disk` takes it (`KIND:SIZE/TIME[:burst=N]` joined by
        /// `+`), or `none`.
        rate: String,
    },
    /// The CPU limits and what they did.
    Groups {},
    /// The PPA page: what the guest published, decoded and checked.
    Guest {},
    /// Asks the guest agent to restart its figures from 0 (through the PPA page's VM record);
    /// the agent acknowledges at its next sample.
    GuestReset {},
    /// Parks every vCPU until `resume`.
    Pause {},
    /// Releases a pause.
    Resume {},
    /// Stops every vCPU; the final report is still written.
    Shutdown {},
    /// The Prometheus/OpenMetrics text exposition.
    Metrics {},
    /// One device's figures (spec section 10). The argument is `name`, since `id` is the
    /// request's own.
    Device {
        /// Device id (`net0`).
        name: String,
    },
    /// Streams events on this connection.
    Subscribe {
        /// Which events; every kind when empty (`pressure` only with a trigger).
        #[serde(default)]
        events: Vec<EventKind>,
        /// The pressure trigger of `pressure` events.
        #[serde(default)]
        pressure: Option<PressureTrigger>,
    },
    /// CPU pressure of the VM and of each vCPU group (PSI's some/full).
    Pressure {},
}

/// Names of every command this version understands.
pub const COMMANDS: [&str; 21] = [
    "version",
    "stats",
    "vcpu",
    "histogram",
    "reset",
    "set-level",
    "set-thresholds",
    "threads",
    "set-limit",
    "set-pin",
    "set-rate",
    "groups",
    "guest",
    "guest-reset",
    "pause",
    "resume",
    "shutdown",
    "metrics",
    "subscribe",
    "device",
    "pressure",
];

/// Commands of the specification that later versions add (told apart from misspellings in
/// the error message).
pub const LATER_COMMANDS: [&str; 0] = [];

/// Classes of error responses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ErrorKind {
    /// The request line is longer than [`MAX_REQUEST_BYTES`].
    TooLong,
    /// The line is not a JSON object.
    BadJson,
    /// `cmd` is missing or names no command.
    UnknownCommand,
    /// An argument is missing, unknown or of the wrong type, or a key appears twice.
    BadRequest,
    /// The vCPU does not exist.
    NoSuchVcpu,
    /// The histogram does not exist.
    NoSuchHistogram,
    /// The device does not exist.
    NoSuchDevice,
    /// The command cannot apply in the VM's state (pausing a finished VM).
    InvalidState,
    /// The peer's uid is neither the VMM's nor root.
    PermissionDenied,
    /// The server has as many clients as it accepts.
    TooManyClients,
    /// A limit or group the command names is invalid or does not exist.
    BadLimit,
    /// A placement rule (`set-pin`) names what the VM does not have, or CPUs it may not use.
    BadPin,
    /// A `set-rate` value is malformed, or the device has no rate limiter.
    BadRate,
    /// The server failed; the request had no effect.
    Internal,
}

/// The `error` member of a failed response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ErrorBody {
    /// Class.
    pub kind: ErrorKind,
    /// One sentence for people.
    pub message: String,
}

impl ErrorBody {
    /// An error of `kind` saying `message`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        ErrorBody {
            kind,
            message: message.into(),
        }
    }
}

/// One response line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Response {
    /// The request's id, as the request wrote it (null when the request had none or could
    /// not be read).
    pub id: RequestId,
    /// Whether the command succeeded.
    pub ok: bool,
    /// The command's result, when it succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    /// Why it failed, when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorBody>,
}

impl Response {
    /// A success.
    pub fn ok(id: impl Into<RequestId>, result: Value) -> Self {
        Response {
            id: id.into(),
            ok: true,
            result: Some(result),
            error: None,
        }
    }

    /// A failure.
    pub fn err(id: impl Into<RequestId>, error: ErrorBody) -> Self {
        Response {
            id: id.into(),
            ok: false,
            result: None,
            error: Some(error),
        }
    }

    /// The response as one JSON line, newline included.
    pub fn to_line(&self) -> String {
        let mut s = serde_json::to_string(self).unwrap_or_else(|_| {
            r#"{"id":null,"ok":false,"error":{"kind":"internal","message":"the response could not be encoded"}}"#
                .to_string()
        });
        s.push('\n');
        s
    }
}

#[cfg(test)]
mod tests;
