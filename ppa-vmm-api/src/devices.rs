//! Result types of devices (spec section 10): each device's threads, queues, CPU and drops,
//! in `stats`, the `device` command and the final report; and the VM's host CPU split.
//!
//! The VMM fills them from the device threads' single-writer counters and meters on reader
//! threads. Every field is defined in docs/accounting.md ("Devices").

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{BlkRequestKind, BlkStatus, DeviceHealth, DeviceKind, DropReason, QueueKind};

/// One device thread's figures: `wall_ns = used_ns + steal_ns + waiting_ns + blocked_ns +
/// limited_ns`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeviceThreadStats {
    /// Thread name (`net0-qp0`).
    pub name: String,
    /// Host thread id (0 before the thread started).
    pub host_tid: i32,
    /// Time since the thread started (to its end once it ended).
    pub wall_ns: u64,
    /// Its CPU clock.
    pub used_ns: u64,
    /// Runnable but waiting for a host CPU (schedstat run_delay).
    pub steal_ns: u64,
    /// Asleep in its event loop, waiting for work.
    pub waiting_ns: u64,
    /// Asleep anywhere else.
    pub blocked_ns: u64,
    /// Held by a CPU limit of scope `vm` (not serving its queues).
    #[serde(default)]
    pub limited_ns: u64,
    /// Frames that waited for a hold to end (those the first pass of each kind carried after
    /// it).
    #[serde(default)]
    pub held_frames: u64,
    /// `wall − (used + steal + waiting + blocked + limited)`.
    pub identity_error_ns: i64,
}

/// One virtqueue's counts (each written by the one thread that serves the queue).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct QueueStats {
    /// Queue index (rx0 = 0, tx0 = 1, rx1 = 2, …, the control queue last).
    pub index: u16,
    /// `rx`, `tx`, `ctrl` or `req`.
    pub kind: QueueKind,
    /// Guest kicks of this queue (each a write of its index to QueueNotify: an ioeventfd
    /// signal, or a userspace exit where the host has no MMIO ioeventfd).
    pub notifications: u64,
    /// Used-buffer interrupts raised for this queue.
    pub interrupts: u64,
    /// Interrupts not raised because the driver did not ask for them (EVENT_IDX's used_event,
    /// or VRING_AVAIL_F_NO_INTERRUPT).
    pub interrupts_suppressed: u64,
    /// Descriptor chains taken from the queue.
    pub chains: u64,
    /// Frames carried (written to the tap for tx, to the guest for rx); 0 on a block
    /// device's queue, which carries requests.
    pub packets: u64,
    /// Requests answered (a block device's `req` queue; absent on a network device's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests: Option<u64>,
    /// Bytes of those frames (the virtio header excluded), or of those requests' data (read
    /// into the guest and written from it).
    pub bytes: u64,
    /// Received frames that went through the device's host buffer instead of straight into
    /// the guest's buffers (the guest had too few buffers available for the largest frame).
    #[serde(default)]
    pub copied: u64,
    /// Times the queue stopped because its device's rate limiter had too few tokens for the
    /// next frame or request (`rate=`; 0 without one).
    #[serde(default)]
    pub throttles: u64,
    /// Time the queue waited for its rate limiter's tokens, a wait in progress included.
    #[serde(default)]
    pub throttled_ns: u64,
    /// Frames dropped, by reason (reasons with at least one drop).
    pub drops: BTreeMap<DropReason, u64>,
}

/// A device's mean CPU per frame, ns (null while no frame went that way): the CPU of each
/// way's work over the frames it handled (delivered or sent, and dropped), both counted only
/// while the CPU marks are taken (not at level off). A mean: [`FrameCpu`] has the spread.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PerPacket {
    /// Mean CPU of the transmit work per frame handled.
    pub tx: Option<u64>,
    /// Mean CPU of the receive work per frame handled.
    pub rx: Option<u64>,
}

/// What the mean CPU per frame ([`PerPacket`]) is made of, each way: the frames it divides by,
/// and a histogram over the work's batches of each batch's CPU over its frames (log-linear, as
/// the exit histograms), so that a tail shows where a mean hides it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FrameCpu {
    /// Frames received (delivered and dropped) while the marks were taken.
    pub rx_frames: u64,
    /// Frames transmitted (sent and dropped) while the marks were taken.
    pub tx_frames: u64,
    /// Per receive batch: its CPU over its frames, ns.
    pub rx_per_batch: crate::HistogramJson,
    /// Per transmit batch: its CPU over its frames, ns.
    pub tx_per_batch: crate::HistogramJson,
}

/// A device's CPU by kind of work, ns.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(deny_unknown_fields)]
pub struct DeviceCpu {
    /// Transmit queues' work.
    pub tx: u64,
    /// Receive queues' work.
    pub rx: u64,
    /// The control queue's work.
    pub ctrl: u64,
    /// A block device's request queues' work (parsing, the file's reads, writes and flushes,
    /// the used ring).
    #[serde(default)]
    pub req: u64,
    /// A block device's polling: its request threads looking at an empty ring for new
    /// requests before they sleep (`--disk …,poll_us=N`).
    #[serde(default)]
    pub poll: u64,
    /// The rest: the event loops' own cost (waits, wake-ups, following the driver's resets).
    pub other: u64,
}

/// What the device's driver did (register accesses, counted on vCPU threads).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DriverStats {
    /// Features the driver accepted (a bit mask).
    pub features: u64,
    /// Times the driver started the device (DRIVER_OK).
    pub activations: u64,
    /// Resets it asked for.
    pub resets: u64,
    /// Resets whose register write returned before every device thread had let go of its
    /// queues (the write waits 20 ms at most; the status reads 0 at once either way).
    #[serde(default)]
    pub resets_unsettled: u64,
    /// Kicks that reached the VMM as userspace exits (0 where ioeventfds catch them).
    pub notify_exits: u64,
    /// Rules the driver broke, by name.
    pub violations: BTreeMap<String, u64>,
}

/// One device (an element of `devices`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeviceStats {
    /// Device id (`net0`).
    pub id: String,
    /// `net` or `blk`.
    pub kind: DeviceKind,
    /// Its backend: the tap's name, or the disk's path.
    pub backend: String,
    /// The guest's MAC address (net).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// Its rate limiter's buckets, as `rate=` gives them (absent without one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<String>,
    /// Guest-physical base of its MMIO window.
    pub mmio_base: u64,
    /// Its interrupt (GSI), when the guest has an interrupt controller.
    pub gsi: Option<u32>,
    /// `ok`, `needs_reset` or `failed`.
    pub status: DeviceHealth,
    /// Why it is not `ok`, in a sentence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_reason: Option<String>,
    /// What is wrong with its backend now (a tap gone or failing), in a sentence; absent while
    /// it works.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_error: Option<String>,
    /// Its threads.
    pub threads: Vec<DeviceThreadStats>,
    /// Its queues.
    pub queues: Vec<QueueStats>,
    /// CPU of all its threads.
    pub cpu_ns: u64,
    /// That CPU by kind of work.
    pub cpu: DeviceCpu,
    /// Mean CPU per frame, each way (net).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_ns_per_packet: Option<PerPacket>,
    /// The frames and the per-batch spread behind that mean (net).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frame_cpu: Option<FrameCpu>,
    /// The driver's side.
    pub driver: DriverStats,
    /// A block device's requests, bytes and errors (blk).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blk: Option<BlkStats>,
    /// Per request type, the service time of each request from the moment the device took
    /// its chain to the moment it gave it back (blk; types with at least one request).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<BTreeMap<BlkRequestKind, crate::HistogramJson>>,
}

/// What a block device did (`blk` of [`DeviceStats`]). Every field is defined in
/// docs/accounting.md ("Block devices").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BlkStats {
    /// The disk's size the guest sees, bytes (the file's size down to a 512-byte sector).
    pub capacity_bytes: u64,
    /// Whether the disk is read-only (`VIRTIO_BLK_F_RO`).
    pub readonly: bool,
    /// Whether the device offers DISCARD (the file can punch holes).
    pub discard: bool,
    /// Whether the device offers WRITE_ZEROES (the file can zero or punch a range).
    pub write_zeroes: bool,
    /// Whether the driver negotiated FLUSH: without it every write is made durable
    /// (`fdatasync`) before it completes.
    pub flush_negotiated: bool,
    /// Requests answered, by type (types with at least one).
    pub requests: BTreeMap<BlkRequestKind, u64>,
    /// Bytes read from the disk into the guest.
    pub bytes_read: u64,
    /// Bytes written from the guest to the disk.
    pub bytes_written: u64,
    /// Requests answered with a status other than OK, by status (statuses seen).
    pub errors: BTreeMap<BlkStatus, u64>,
    /// Reads and writes whose data went to the file in the same call as the request before
    /// them (merged with it: docs/design.md); the reads' and writes' file calls are their
    /// count less this.
    #[serde(default)]
    pub merged: u64,
}

/// Where the VMM process's CPU went: every thread in one of the three (`host_cpu_ns`).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(deny_unknown_fields)]
pub struct HostCpuSplit {
    /// The vCPU threads' CPU clocks.
    pub vcpus: u64,
    /// The device threads' CPU clocks.
    pub devices: u64,
    /// Every other thread of the process (main, api, sampler, limiter, signals, ended
    /// helpers): the process CPU clock less the two above.
    pub service: u64,
    /// Of `vcpus`: the vCPU threads' CPU on their limits' stops (from each stop to the next
    /// guest entry; docs/limits.md, "What a stop costs, and who pays it"): the VMM's work on
    /// those threads, charged to no limit. The KVM round trips the stops forced are in
    /// `vcpus` too and are the groups' `stops.kvm_ns_estimate`.
    #[serde(default)]
    pub vcpu_stops: u64,
}

impl HostCpuSplit {
    /// All three.
    pub fn total(&self) -> u64 {
        self.vcpus + self.devices + self.service
    }
}

/// One device thread in `threads`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeviceThreadInfo {
    /// Device id.
    pub device: String,
    /// Thread name.
    pub name: String,
    /// Host thread id (0 before it started).
    pub host_tid: i32,
    /// The CPUs it may run on, in the kernel's list form; null when not known (the device
    /// does not say; `threads` fills it in).
    #[serde(default)]
    pub cpus: Option<String>,
    /// The CPU it last ran on; null when not known.
    #[serde(default)]
    pub last_cpu: Option<u32>,
}
