//! The device model: devices on address buses, and the small vocabulary of requests a device
//! can make of the vCPU that accessed it.
//!
//! Data flow: the VM builder puts each device on the MMIO or the port [`Bus`] ([`Buses`]),
//! gives devices that raise interrupts an `hypervisor::IrqLine` (irqfd on KVM), and registers
//! the notifications a device wants without a userspace exit ([`BusDevice::ioevents`],
//! ioeventfd on KVM). While the guest runs, a vCPU thread's MMIO or PIO exit goes through
//! `exit::handle_exit` to the bus, which finds the device and calls its `read` or `write` with a
//! [`BusAccess`] (which vCPU, which address, which offset inside the device). The device does
//! its work and its own bookkeeping (per-vCPU state lives in the device, in atomics written by
//! that vCPU's thread) and answers with an optional [`VcpuRequest`]: `Exit(code)`, `Park`, or
//! `Stop`. The vCPU loop carries requests out and knows nothing of any device's protocol.
//!
//! Devices: [`tiny`] (the tiny guest's doorbells, console, report registers and workload
//! port); for Linux guests [`serial`] (a 16550 UART with its interrupt) and [`i8042`] (whose
//! reset command stops the VM); for every guest the virtio devices over MMIO ([`virtio`]:
//! the transport; [`net`]: virtio-net on a tap; [`blk`]: virtio-blk on a file), which have
//! threads of their own ([`Device`]).

use std::sync::Arc;

use vmm_sys_util::eventfd::EventFd;

use crate::accounting::AccountingControl;
use crate::hypervisor::IoAddr;

pub mod blk;
pub mod bus;
pub mod i8042;
pub mod net;
pub mod rate;
pub mod serial;
pub mod tiny;
pub mod uring;
pub mod virtio;

pub use bus::{BusError, Buses};

/// At most 64 characters of untrusted input (a device's option value) for an error message,
/// with `…` where it was cut.
pub fn cut(s: &str) -> String {
    let mut out: String = s.chars().take(64).collect();
    if out.len() < s.len() {
        out.push('…');
    }
    out
}

/// One guest access to a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BusAccess {
    /// Index of the vCPU that made it.
    pub vcpu: usize,
    /// Guest address (MMIO) or port (PIO) of the first byte.
    pub addr: u64,
    /// Offset of the first byte inside the device's range.
    pub offset: u64,
}

/// What a device asks of the vCPU that accessed it. Without a request the vCPU resumes the
/// guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VcpuRequest {
    /// The vCPU stops for good with this exit code (the guest's own end).
    Exit(u64),
    /// The vCPU parks, idle, until `deadline_ns` (CLOCK_MONOTONIC) or until kicked (a guest
    /// halt the VMM implements).
    Park {
        /// When the park ends by itself; None: only a kick ends it.
        deadline_ns: Option<u64>,
    },
    /// The guest asked for the whole VM to stop (a reset or power-off request): this vCPU
    /// ends and the VM stops the others.
    Stop,
}

/// A notification a device wants without a userspace exit: when the guest writes `addr` (a
/// 32-bit write of the value `datamatch`, when given; any write otherwise), the hypervisor
/// signals `fd`, and the vCPU goes on.
#[derive(Debug)]
pub struct IoEvent<'a> {
    /// The address.
    pub addr: IoAddr,
    /// The 32-bit value to match, or None for any write.
    pub datamatch: Option<u32>,
    /// The eventfd the device waits on.
    pub fd: &'a EventFd,
}

/// A device on a bus. Calls come from vCPU threads, concurrently for different vCPUs: a
/// device keeps its per-vCPU state apart and takes no lock another thread could hold while
/// a vCPU waits (the exit path must stay lock-free).
pub trait BusDevice: Send + Sync {
    /// The guest reads `data.len()` bytes: fill `data`.
    fn read(&self, access: BusAccess, data: &mut [u8]) -> Option<VcpuRequest>;
    /// The guest writes `data`.
    fn write(&self, access: BusAccess, data: &[u8]) -> Option<VcpuRequest>;
    /// The notifications this device wants without an exit (registered once, at build time).
    fn ioevents(&self) -> Vec<IoEvent<'_>> {
        Vec::new()
    }
    /// vCPU `vcpu`'s loop has ended (called on that vCPU's thread): flush what is buffered
    /// for it.
    fn vcpu_ended(&self, vcpu: usize) {
        let _ = vcpu;
    }
}

/// A device with threads of its own (the virtio devices), as the VM and readers see it: the
/// VM starts its threads before the vCPUs and stops them after; readers take its figures.
pub trait Device: Send + Sync {
    /// Its id (`net0`).
    fn id(&self) -> &str;
    /// Starts its threads (`control` says how much they measure).
    fn start(&self, control: &Arc<AccountingControl>) -> std::io::Result<()>;
    /// Stops and joins its threads.
    fn stop(&self);
    /// Its figures now.
    fn stats(&self) -> ppa_vmm_api::DeviceStats;
    /// Its threads' names and host tids.
    fn threads(&self) -> Vec<ppa_vmm_api::DeviceThreadInfo>;
    /// Its threads' CPU time now.
    fn cpu_ns(&self) -> u64;
    /// Restarts its figures from zero (the socket's `reset` of the whole VM).
    fn reset(&self);
    /// Wakes each of its threads once: after their CPU sets changed (`--pin`, `set-pin`: a
    /// thread asleep since keeps the CPU it slept on until it wakes), or a limit held or
    /// released them (each thread looks at its hold before it waits). By default nothing.
    fn wake_threads(&self) {}
    /// Its threads' meters, one per thread in the order of [`Device::threads`] (what a CPU
    /// limit of scope `vm` charges and holds). By default none.
    fn worker_meters(&self) -> &[crate::accounting::worker::WorkerMeter] {
        &[]
    }
    /// `set-rate`: replaces its rate limiters' buckets with those of a `rate=` value as its
    /// `--net` or `--disk` takes it (`none`: no buckets), full, and wakes its threads so that
    /// a queue waiting for the old buckets asks the new ones. Returns the value in force. By
    /// default the device has no rate limiter.
    fn set_rate(&self, _rate: &str) -> Result<Option<String>, rate::RateSpecError> {
        Err(rate::RateSpecError::NotLimited(self.id().to_string()))
    }
}

/// Little-endian value of a guest write of 1 to 8 bytes (longer writes keep their first 8).
pub fn le_value(data: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    let n = data.len().min(8);
    b[..n].copy_from_slice(&data[..n]);
    u64::from_le_bytes(b)
}
