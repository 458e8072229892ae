//! The closed sets of words the protocol uses as values: vCPU micro-states, VM states, end
//! reasons, the split kind, thread states, limit backends, threshold names and the kinds of
//! some events.
//!
//! Each is an enum whose wire name is given once, in its declaration below (the `names!`
//! macro): serde serialises it under that name (JSON of the socket and of the final report),
//! and `as_str`, `Display` and `FromStr` use the same literal, so text output and metrics
//! labels cannot drift from the JSON. Producers (the VMM) build the enum; consumers
//! compare with it rather than with strings.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// A word that names no value of the set it was parsed as.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("`{}` is not {what} (one of: {})", crate::clip(.name), .known.join(", "))]
pub struct UnknownName {
    /// What was expected (`a threshold`, `a VM state`, ...).
    pub what: &'static str,
    /// The word given.
    pub name: String,
    /// Every valid word.
    pub known: &'static [&'static str],
}

/// Declares an enum whose variants are named on the wire by the given literals, with `ALL`,
/// `NAMES`, `as_str`, `Display` and `FromStr`.
macro_rules! names {
    (
        $(#[$meta:meta])*
        pub enum $name:ident ($what:literal) {
            $( $(#[$vmeta:meta])* $variant:ident = $text:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
        pub enum $name {
            $( $(#[$vmeta])* #[serde(rename = $text)] $variant, )+
        }

        impl $name {
            /// Number of values.
            pub const COUNT: usize = <[&str]>::len(&[$($text),+]);
            /// Every value, in declaration order.
            pub const ALL: [$name; Self::COUNT] = [$($name::$variant),+];
            /// Every wire name, in declaration order.
            pub const NAMES: [&'static str; Self::COUNT] = [$($text),+];

            /// The name on the wire (JSON, metrics labels, text output).
            pub const fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)+
                }
            }

            /// The position in declaration order (0 to `COUNT - 1`).
            pub const fn index(self) -> usize {
                self as usize
            }
        }

        impl fmt::Display for $name {
            /// The wire name, padded and aligned as the format asks (`{:>8}`).
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.pad(self.as_str())
            }
        }

        impl FromStr for $name {
            type Err = UnknownName;

            fn from_str(s: &str) -> Result<Self, UnknownName> {
                Self::ALL
                    .into_iter()
                    .find(|v| v.as_str() == s)
                    .ok_or_else(|| UnknownName {
                        what: $what,
                        name: s.to_string(),
                        known: &Self::NAMES,
                    })
            }
        }
    };
}

names! {
    /// What a vCPU thread was doing when its figures were read (`state` of [`crate::VcpuTimes`]
    /// and [`crate::VcpuSummary`]).
    pub enum VcpuMicroState ("a vCPU micro-state") {
        /// Inside KVM_RUN.
        Guest = "guest",
        /// Outside KVM_RUN, handling an exit or doing bookkeeping.
        Vmm = "vmm",
        /// Parked because the guest asked to idle.
        Idle = "idle",
        /// Parked because a CPU limit was exhausted.
        Limited = "limited",
        /// Parked because an operator paused the VM.
        Paused = "paused",
        /// The thread's loop has ended.
        Finished = "finished",
    }
}

names! {
    /// How guest and VMM time were split over the exits counted (`split` of
    /// [`crate::VcpuTimes`]).
    pub enum SplitKind ("a split kind") {
        /// Every exit at level full: measured with the thread CPU clock.
        Exact = "exact",
        /// Every timed exit at level basic: estimated from wall time.
        Estimated = "estimated",
        /// Some exits at each level.
        Mixed = "mixed",
        /// No timed exit (level off throughout).
        None = "none",
    }
}

impl SplitKind {
    /// How the GUEST/VMM split was made, in words for the text report's legend: with
    /// `source`, what measured the exact part.
    pub fn legend(self, source: SplitSource) -> String {
        let exact = match source {
            SplitSource::Records => "measured exactly from context-switch records (level full)",
            SplitSource::Tracepoints => {
                "measured exactly from context-switch records and KVM's tracepoints (level full)"
            }
            SplitSource::CpuClock => "measured exactly with the thread CPU clock (level full)",
            SplitSource::Mixed | SplitSource::None => "measured exactly (level full)",
        };
        match self {
            SplitKind::Exact => exact.to_string(),
            SplitKind::Estimated => {
                "estimated from wall time at level basic (level full measures it)".to_string()
            }
            SplitKind::Mixed => {
                format!("{exact} for some exits, estimated (level basic) for the rest")
            }
            SplitKind::None => "not made (accounting off)".to_string(),
        }
    }
}

names! {
    /// What measured the on-CPU part of each interval at level full (`split_source` of
    /// [`crate::VcpuTimes`] and [`crate::VcpuSummary`]).
    pub enum SplitSource ("a split source") {
        /// The thread's context-switch records (perf): no system call on the exit path.
        Records = "records",
        /// The records, and KVM's tracepoints in the same ring split each KVM_RUN into guest
        /// mode, KVM's exit handling and host interrupts (`kvm_ns` measured).
        Tracepoints = "tracepoints",
        /// The thread CPU clock, read at every KVM_RUN boundary.
        CpuClock = "cpu_clock",
        /// Some intervals each way.
        Mixed = "mixed",
        /// No interval at level full.
        None = "none",
    }
}

names! {
    /// How a vCPU thread takes its exit and entry stamps (`stamp_clock` of
    /// [`crate::VcpuTimes`]; docs/accounting.md, "The stamp clock").
    pub enum StampClockMode ("a stamp clock mode") {
        /// CLOCK_MONOTONIC read through the vDSO about once a millisecond and extrapolated by
        /// the TSC in between.
        Tsc = "tsc",
        /// The host allows extrapolation, but no rate is known yet (the first ~14 ms, or
        /// after a step in the clock's rate): every stamp is a vDSO read meanwhile.
        Learning = "learning",
        /// Every stamp is a vDSO read: the host does not allow extrapolation (no invariant
        /// TSC, or the kernel's clocksource is not `tsc`).
        Vdso = "vdso",
        /// Every stamp is a vDSO read: the thread gave extrapolation up (the rate kept
        /// drifting, or no anchor could be taken).
        GivenUp = "given_up",
    }
}

names! {
    /// The state of a VM (`state` of [`crate::VmStats`]).
    pub enum VmState ("a VM state") {
        /// Built; its vCPUs have not been released.
        Created = "created",
        /// Its vCPUs run.
        Running = "running",
        /// An operator paused it.
        Paused = "paused",
        /// A shutdown was asked for; the vCPUs are stopping.
        Stopping = "stopping",
        /// Every vCPU thread has ended.
        Finished = "finished",
    }
}

names! {
    /// How a run ended (`vm.end` of the final report, `end` of the vm-exit event).
    pub enum VmEnd ("a VM end") {
        /// Every vCPU exited with code 0.
        Completed = "completed",
        /// A vCPU failed or exited with another code.
        Failed = "failed",
        /// `--max-runtime` stopped it.
        Timeout = "timeout",
        /// An operator asked for a shutdown and no vCPU failed.
        Shutdown = "shutdown",
    }
}

impl VmEnd {
    /// Whether the run ended cleanly (the process exits with 0): completed or shut down.
    pub fn is_clean(self) -> bool {
        matches!(self, VmEnd::Completed | VmEnd::Shutdown)
    }
}

names! {
    /// How a vCPU thread ended (`end` of a report's vCPU and of the vcpu-exit event).
    pub enum VcpuEndKind ("a vCPU end") {
        /// The guest exited with a code.
        Exited = "exited",
        /// The guest did something the VMM cannot handle (a failure with registers).
        Failed = "failed",
        /// The VMM failed to run the vCPU.
        Error = "error",
        /// Stopped from outside (shutdown, timeout, another vCPU's end).
        Stopped = "stopped",
    }
}

names! {
    /// The life-cycle state of a vCPU thread (`state` of [`crate::ThreadInfo`]).
    pub enum ThreadState ("a thread state") {
        /// Created, not yet in its loop.
        Created = "created",
        /// In or around KVM_RUN.
        Running = "running",
        /// Parked by the VMM.
        Parked = "parked",
        /// Its loop has ended.
        Finished = "finished",
    }
}

names! {
    /// Who enforces a CPU limit (`backend` of [`crate::GroupStats`], `--limit-backend`).
    #[derive(Default)]
    pub enum LimitBackend ("a limit backend") {
        /// The VMM itself, with the thread CPU clocks.
        #[default]
        Vmm = "vmm",
        /// The kernel's CFS bandwidth control, through cgroups.
        Cgroup = "cgroup",
    }
}

names! {
    /// What a VM's CPU limit covers (`scope` of [`crate::GroupStats`], `--cpu-limit L,scope=S`).
    #[derive(Default)]
    pub enum LimitScope ("a limit scope") {
        /// The vCPU threads alone.
        #[default]
        Vcpus = "vcpus",
        /// The vCPU threads and the device threads: everything the VM costs but the VMM's
        /// service threads.
        Vm = "vm",
    }
}

names! {
    /// How the members of a CPU limit are stopped (`kicks.path` of [`crate::GroupStats`]).
    pub enum LimitKick ("a limit kick path") {
        /// Each member's kick timer (armed by the vCPU thread, fired by the kernel) stops it;
        /// the limiter thread keeps the books and kicks only when a timer was late.
        Timer = "timer",
        /// The limiter thread's kicks alone (timers disabled, or not available on the host).
        Limiter = "limiter",
        /// The cgroup backend: the kernel throttles the threads, nothing is kicked.
        Kernel = "kernel",
    }
}

names! {
    /// A PPA-style threshold: its name in [`crate::Thresholds`], the `threshold` event, the
    /// per-vCPU `thresholds` counts and the metrics labels.
    pub enum Threshold ("a threshold") {
        /// Userspace handling time of one exit.
        ExitHandling = "exit_handling_ns",
        /// Duration of one KVM_RUN.
        GuestRun = "guest_run_ns",
        /// From the release of a parked vCPU until it is back in KVM_RUN.
        WakeupLatency = "wakeup_latency_ns",
        /// Steal time within one sampler window.
        StealWindow = "steal_window_ns",
    }
}

impl Threshold {
    /// This threshold's value in `t`.
    pub fn of(self, t: &crate::Thresholds) -> u64 {
        match self {
            Threshold::ExitHandling => t.exit_handling_ns,
            Threshold::GuestRun => t.guest_run_ns,
            Threshold::WakeupLatency => t.wakeup_latency_ns,
            Threshold::StealWindow => t.steal_window_ns,
        }
    }

    /// Sets this threshold's value in `t`.
    pub fn set(self, t: &mut crate::Thresholds, ns: u64) {
        match self {
            Threshold::ExitHandling => t.exit_handling_ns = ns,
            Threshold::GuestRun => t.guest_run_ns = ns,
            Threshold::WakeupLatency => t.wakeup_latency_ns = ns,
            Threshold::StealWindow => t.steal_window_ns = ns,
        }
    }
}

names! {
    /// What the runaway and overload detection saw (`kind` of the overload event).
    pub enum OverloadKind ("an overload kind") {
        /// In the guest too long without an exit or an idle.
        Runaway = "runaway",
        /// Above its share for too many windows.
        Overload = "overload",
    }
}

names! {
    /// Why a CPU limit released its members (`why` of the throttle-end event).
    pub enum ThrottleEndWhy ("a throttle end") {
        /// A new period began.
        Period = "period",
        /// The members that could still run went idle, so the budget was shared again.
        Redistributed = "redistributed",
        /// A turn that straddles the period's end began: its members run on into the next
        /// period (docs/limits.md, "Turns").
        Turn = "turn",
    }
}

names! {
    /// A device's kind (`kind` of [`crate::DeviceStats`]).
    pub enum DeviceKind ("a device kind") {
        /// virtio-net on a tap.
        Net = "net",
        /// virtio-blk on a file.
        Blk = "blk",
    }
}

names! {
    /// What a virtqueue carries (`kind` of [`crate::QueueStats`]).
    pub enum QueueKind ("a queue kind") {
        /// Frames to the guest.
        Rx = "rx",
        /// Frames from the guest.
        Tx = "tx",
        /// The network device's control queue (queue pairs in use).
        Ctrl = "ctrl",
        /// Block requests.
        Req = "req",
    }
}

names! {
    /// A block request's type (keys of `requests` and `service` of [`crate::DeviceStats`]).
    #[derive(PartialOrd, Ord)]
    pub enum BlkRequestKind ("a block request type") {
        /// VIRTIO_BLK_T_IN: sectors read into the guest.
        Read = "read",
        /// VIRTIO_BLK_T_OUT: sectors written from the guest.
        Write = "write",
        /// VIRTIO_BLK_T_FLUSH: what was written made durable (`fdatasync`).
        Flush = "flush",
        /// VIRTIO_BLK_T_GET_ID: the disk's id string.
        GetId = "get_id",
        /// VIRTIO_BLK_T_DISCARD: ranges the guest no longer needs.
        Discard = "discard",
        /// VIRTIO_BLK_T_WRITE_ZEROES: ranges made to read as zeros.
        WriteZeroes = "write_zeroes",
        /// A type the device does not know (answered UNSUPP).
        Unknown = "unknown",
    }
}

names! {
    /// A block request's status other than OK (keys of `errors` of [`crate::BlkStats`]).
    #[derive(PartialOrd, Ord)]
    pub enum BlkStatus ("a block request status") {
        /// VIRTIO_BLK_S_IOERR: a malformed request, one past the disk's end, a write to a
        /// read-only disk, or the file's own error.
        Ioerr = "ioerr",
        /// VIRTIO_BLK_S_UNSUPP: a type the device does not offer.
        Unsupp = "unsupp",
    }
}

names! {
    /// A device's health (`status` of [`crate::DeviceStats`]).
    pub enum DeviceHealth ("a device status") {
        /// Working, or waiting for a driver.
        Ok = "ok",
        /// Stopped by an error (a malformed descriptor chain, a driver that broke the
        /// initialisation rules) until the driver resets it.
        NeedsReset = "needs_reset",
        /// The driver gave up on it (e.g. the device refused a legacy driver's features).
        Failed = "failed",
    }
}

names! {
    /// Why a device dropped a frame (keys of `drops` of [`crate::QueueStats`]).
    #[derive(PartialOrd, Ord)]
    pub enum DropReason ("a drop reason") {
        /// The guest's receive queue was not set up, so a frame from the tap had nowhere to
        /// go (a guest with buffers but none free makes the device wait, not drop).
        NoRxBuffer = "no_rx_buffer",
        /// The tap refused a frame for now (its queue full).
        TapWouldBlock = "tap_would_block",
        /// The chain that carried it was malformed (the device then needs a reset).
        BadChain = "bad_chain",
        /// Larger than the device takes (a transmit chain over 64 KiB of frame, or a
        /// received frame larger than a receive chain without mergeable buffers, or than
        /// every buffer the guest had made available).
        OversizedFrame = "oversized_frame",
        /// A received frame, not segmentation-offloaded, longer than the device's MTU plus
        /// its Ethernet header and one VLAN tag (virtio 1.2, 5.1.6.3.1).
        OverMtu = "over_mtu",
        /// A frame read from the tap when the driver reset the device.
        DeviceReset = "device_reset",
        /// The tap was down or gone (EIO, ENODEV or EBADFD from it).
        TapDown = "tap_down",
        /// Another error from the tap.
        TapError = "tap_error",
    }
}
